package snippets

// Inside a handler for TicketAssigned of the ticket_assignments projection.
var assign string

var e TicketAssigned
