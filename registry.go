package projector

import (
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"sync"
)

// Validator is implemented by payloads that can check themselves. The store
// calls Validate before it writes anything; an error refuses the whole append
// and matches [ErrInvalidPayload].
type Validator interface {
	Validate() error
}

// UpcastFunc turns a stored payload of one schema version into the JSON of
// the next version. It must not keep a reference to its argument.
type UpcastFunc func(old json.RawMessage) (json.RawMessage, error)

// Upcaster converts payloads stored at schema version From into version
// From+1.
type Upcaster struct {
	From int
	Func UpcastFunc
}

// TypeConfig describes how an event type's payload has evolved. The zero value
// is a type that is still at its first schema version.
type TypeConfig struct {
	// SchemaVersion is the version of the payload shape the Go type has now;
	// 0 means 1. Appends record it, so later shapes can upcast older rows.
	SchemaVersion int
	// Upcasters hold one step for every older version, 1 to SchemaVersion-1.
	// Reads apply them in order before decoding into the Go type.
	Upcasters []Upcaster
	// Personal declares the payload's personal fields and its data
	// subject, checked here: the store seals those fields under the
	// subject's key at append, and forgetting the subject destroys the key
	// (docs/privacy.md). The zero value declares none.
	Personal Personal
}

// EventType is the handle [Define] returns for an event type whose payload
// Go type is T. Typed handlers and filters take it instead of a bare name, so
// a typo is a compile error rather than a silent miss.
type EventType[T any] struct {
	name    string
	version int
}

// Name returns the registered type name, such as "ticket.opened".
func (e EventType[T]) Name() string { return e.name }

// SchemaVersion returns the current schema version of the payload.
func (e EventType[T]) SchemaVersion() int { return e.version }

// TypeInfo is what the registry knows of one event type.
type TypeInfo struct {
	Name          string
	GoType        reflect.Type
	SchemaVersion int
	// Personal is the type's personal-data declaration (zero: none).
	Personal Personal
}

type typeEntry struct {
	TypeInfo
	upcasters []UpcastFunc // index i upcasts version i+1 to i+2
	decode    func(json.RawMessage) (any, error)
	// validates says where the payload type implements [Validator], found
	// once at Define instead of by a copy of every payload encoded.
	validates validatorKind
}

// validatorKind is where a payload type implements [Validator].
type validatorKind uint8

const (
	validatesNone    validatorKind = iota // neither T nor *T: nothing to run
	validatesValue                        // T (and so *T)
	validatesPointer                      // *T only: run on a copy's address
)

// validatorOf finds where t implements [Validator].
func validatorOf(t reflect.Type) validatorKind {
	v := reflect.TypeFor[Validator]()
	switch {
	case t.Implements(v):
		return validatesValue
	case reflect.PointerTo(t).Implements(v):
		return validatesPointer
	}
	return validatesNone
}

// Registry holds every defined event type. Define all types at start-up,
// before the first append or read; the registry is safe for concurrent use.
// Its zero value is an empty registry, as [NewRegistry] returns.
type Registry struct {
	mu     sync.RWMutex
	byName map[string]*typeEntry
	byType map[reflect.Type]*typeEntry
	// personal: some type declares personal fields (and subject.forgotten
	// is defined).
	personal bool
	// personalTypes and personalSubjects list, in definition order, the
	// types with personal fields and their subject fields: appended to,
	// never changed, so a reader may keep a slice it was given.
	personalTypes, personalSubjects []string
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{byName: map[string]*typeEntry{}, byType: map[reflect.Type]*typeEntry{}}
}

// typeNamePattern enforces "<area>.<past-tense-verb>", with more dotted parts
// allowed ("billing.invoice.paid"), all lower case.
var typeNamePattern = regexp.MustCompile(`^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$`)

// Define registers T as the payload of the event type name. Names are
// "<area>.<past-tense-verb>" in lower case ("ticket.opened"). A name or a Go
// type can be defined once; T must be a non-pointer, non-interface type that
// encoding/json can encode. Pass at most one [TypeConfig] when the payload
// has more than one schema version.
func Define[T any](r *Registry, name string, cfg ...TypeConfig) (EventType[T], error) {
	var zero EventType[T]
	if r == nil {
		return zero, fmt.Errorf("%w: define %q: nil registry", ErrInvalidEventType, name)
	}
	if len(cfg) > 1 {
		return zero, fmt.Errorf("%w: define %q: at most one TypeConfig", ErrInvalidEventType, name)
	}
	var c TypeConfig
	if len(cfg) == 1 {
		c = cfg[0]
	}
	if len(name) > MaxNameLength {
		return zero, fmt.Errorf("%w: define %s: a name is at most %d bytes", ErrInvalidEventType, Printable(name), MaxNameLength)
	}
	if !typeNamePattern.MatchString(name) {
		return zero, fmt.Errorf("%w: define %q: a name is <area>.<past-tense-verb> in lower case, such as \"ticket.opened\"", ErrInvalidEventType, name)
	}
	goType := reflect.TypeFor[T]()
	switch goType.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Func, reflect.Chan, reflect.UnsafePointer:
		return zero, fmt.Errorf("%w: define %q: payload type %s must be a value type such as a struct", ErrInvalidEventType, name, goType)
	}
	version := c.SchemaVersion
	if version == 0 {
		version = 1
	}
	if version < 1 {
		return zero, fmt.Errorf("%w: define %q: schema version %d is below 1", ErrInvalidEventType, name, version)
	}
	steps := make([]UpcastFunc, version-1)
	for _, u := range c.Upcasters {
		if u.From < 1 || u.From >= version {
			return zero, fmt.Errorf("%w: define %q: upcaster from version %d is outside 1..%d", ErrInvalidEventType, name, u.From, version-1)
		}
		if u.Func == nil {
			return zero, fmt.Errorf("%w: define %q: upcaster from version %d has no function", ErrInvalidEventType, name, u.From)
		}
		if steps[u.From-1] != nil {
			return zero, fmt.Errorf("%w: define %q: two upcasters from version %d", ErrInvalidEventType, name, u.From)
		}
		steps[u.From-1] = u.Func
	}
	for i, s := range steps {
		if s == nil {
			return zero, fmt.Errorf("%w: define %q: schema version %d needs an upcaster from version %d", ErrInvalidEventType, name, version, i+1)
		}
	}

	if c.Personal.declared() {
		if err := c.Personal.check(goType); err != nil {
			return zero, fmt.Errorf("%w: define %q: %w", ErrInvalidEventType, name, err)
		}
		c.Personal.Fields = slices.Clone(c.Personal.Fields)
	}

	entry := &typeEntry{
		TypeInfo:  TypeInfo{Name: name, GoType: goType, SchemaVersion: version, Personal: c.Personal},
		upcasters: steps,
		validates: validatorOf(goType),
		decode: func(data json.RawMessage) (any, error) {
			var v T
			if err := json.Unmarshal(data, &v); err != nil {
				return nil, err
			}
			return v, nil
		},
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byName == nil {
		// A zero Registry (var reg projector.Registry) is an empty one, as
		// NewRegistry's: Define panicked on its nil maps.
		r.byName, r.byType = map[string]*typeEntry{}, map[reflect.Type]*typeEntry{}
	}
	if prev, ok := r.byName[name]; ok {
		return zero, fmt.Errorf("%w: %q is already defined with payload %s", ErrDuplicateEventType, name, prev.GoType)
	}
	if prev, ok := r.byType[goType]; ok {
		return zero, fmt.Errorf("%w: payload %s is already the payload of %q", ErrDuplicateEventType, goType, prev.Name)
	}
	if c.Personal.declared() && !r.personal {
		if err := r.defineForgottenLocked(); err != nil {
			return zero, fmt.Errorf("define %q: %w", name, err)
		}
	}
	r.byName[name] = entry
	r.byType[goType] = entry
	if entry.Personal.declared() {
		r.personalTypes = append(r.personalTypes, name)
		r.personalSubjects = append(r.personalSubjects, entry.Personal.Subject)
	}
	return EventType[T]{name: name, version: version}, nil
}

// defineForgottenLocked defines [SubjectForgottenType], which every
// registry with personal data needs for the events forgetting appends.
func (r *Registry) defineForgottenLocked() error {
	name := SubjectForgottenType.Name()
	goType := reflect.TypeFor[SubjectForgotten]()
	if prev, ok := r.byName[name]; ok {
		return fmt.Errorf("%w: %q is reserved for forgetting data subjects, and is already defined with payload %s", ErrDuplicateEventType, name, prev.GoType)
	}
	r.byName[name] = &typeEntry{
		TypeInfo:  TypeInfo{Name: name, GoType: goType, SchemaVersion: 1},
		validates: validatorOf(goType),
		decode: func(data json.RawMessage) (any, error) {
			var v SubjectForgotten
			if err := json.Unmarshal(data, &v); err != nil {
				return nil, err
			}
			return v, nil
		},
	}
	r.byType[goType] = r.byName[name]
	r.personal = true
	return nil
}

// MustDefine is [Define] for package-level declarations: it panics on error,
// which at start-up is the error surfacing where it should.
func MustDefine[T any](r *Registry, name string, cfg ...TypeConfig) EventType[T] {
	et, err := Define[T](r, name, cfg...)
	if err != nil {
		panic(err)
	}
	return et
}

// Lookup returns what the registry knows of the type name.
func (r *Registry) Lookup(name string) (TypeInfo, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.byName[name]
	if !ok {
		return TypeInfo{}, false
	}
	return e.TypeInfo, true
}

// Names returns every defined type name, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.byName))
	for n := range r.byName {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Encoded is a payload ready to be stored.
type Encoded struct {
	Type          string
	SchemaVersion int
	Data          json.RawMessage
}

// Encode resolves payload's event type from its Go type (a pointer is
// followed to its value), validates it and encodes it as JSON. It fails with
// [ErrUnknownEventType] for a type never defined and [ErrInvalidPayload] for
// a payload that fails validation or encoding, or that PostgreSQL's jsonb
// could not store exactly as given: a string that is not valid UTF-8 (which
// encoding/json would silently replace with U+FFFD), a NUL character, or, from
// a custom marshaller, invalid UTF-8 or an unpaired surrogate escape.
func (r *Registry) Encode(payload any) (Encoded, error) {
	if payload == nil {
		return Encoded{}, fmt.Errorf("%w: nil payload", ErrInvalidPayload)
	}
	v := reflect.ValueOf(payload)
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return Encoded{}, fmt.Errorf("%w: nil %s payload", ErrInvalidPayload, v.Type())
		}
		v = v.Elem()
	}
	r.mu.RLock()
	e, ok := r.byType[v.Type()]
	r.mu.RUnlock()
	if !ok {
		return Encoded{}, fmt.Errorf("%w: payload type %s was never defined (call projector.Define)", ErrUnknownEventType, v.Type())
	}
	// The payload itself when it is a T, not a pointer: v.Interface()
	// would copy it into a new interface value for each use.
	value := payload
	if v.Type() != reflect.TypeOf(payload) {
		value = v.Interface()
	}
	if err := validate(v, value, e.validates); err != nil {
		return Encoded{}, fmt.Errorf("%w: %s: %w", ErrInvalidPayload, e.Name, err)
	}
	data, err := json.Marshal(value)
	if err != nil {
		return Encoded{}, fmt.Errorf("%w: %s: encode: %w", ErrInvalidPayload, e.Name, err)
	}
	if err := checkEncoded(data, v); err != nil {
		return Encoded{}, fmt.Errorf("%w: %s: %w", ErrInvalidPayload, e.Name, err)
	}
	return Encoded{Type: e.Name, SchemaVersion: e.SchemaVersion, Data: data}, nil
}

// validate runs Validate on the value (v, and value its interface), or on
// a pointer to a copy of it when only the pointer implements Validator.
func validate(v reflect.Value, value any, kind validatorKind) error {
	switch kind {
	case validatesValue:
		return value.(Validator).Validate()
	case validatesPointer:
		p := reflect.New(v.Type())
		p.Elem().Set(v)
		return p.Interface().(Validator).Validate()
	}
	return nil
}

// Decode upcasts a stored payload from schemaVersion to the type's current
// version and decodes it into the registered Go type. It returns the upcast
// JSON too, and fails with [ErrUnknownEventType] for a name never defined and
// [ErrInvalidPayload] for data that cannot be upcast or decoded, including a
// schema version newer than the type knows (a newer deployment wrote it).
func (r *Registry) Decode(name string, schemaVersion int, data json.RawMessage) (any, json.RawMessage, error) {
	r.mu.RLock()
	e, ok := r.byName[name]
	r.mu.RUnlock()
	if !ok {
		return nil, nil, fmt.Errorf("%w: %q was never defined", ErrUnknownEventType, name)
	}
	v, data, err := e.decodeAt(schemaVersion, data, false)
	return v, data, err
}

// DecodeOpened is [Registry.Decode] for a payload whose sealed personal
// fields the caller has opened already, as a store's read does with the
// subject's key before it decodes: it skips Decode's scan for fields left
// sealed (which it would read as null), a few percent of a sealed read.
// It also returns the type's current schema version, data's once upcast.
func (r *Registry) DecodeOpened(name string, schemaVersion int, data json.RawMessage) (any, json.RawMessage, int, error) {
	r.mu.RLock()
	e, ok := r.byName[name]
	r.mu.RUnlock()
	if !ok {
		return nil, nil, 0, fmt.Errorf("%w: %q was never defined", ErrUnknownEventType, name)
	}
	v, data, err := e.decodeAt(schemaVersion, data, true)
	return v, data, e.SchemaVersion, err
}

// decodeAt upcasts data from schemaVersion and decodes it; opened: its
// sealed fields were opened by the caller.
func (e *typeEntry) decodeAt(schemaVersion int, data json.RawMessage, opened bool) (any, json.RawMessage, error) {
	data, err := e.upcast(schemaVersion, data, opened)
	if err != nil {
		return nil, nil, err
	}
	v, err := e.decode(data)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: decode %s v%d: %w", ErrInvalidPayload, e.Name, e.SchemaVersion, err)
	}
	return v, data, nil
}

// Upcast brings a stored payload to the type's current schema version
// without decoding it, for readers that want JSON only.
func (r *Registry) Upcast(name string, schemaVersion int, data json.RawMessage) (json.RawMessage, int, error) {
	r.mu.RLock()
	e, ok := r.byName[name]
	r.mu.RUnlock()
	if !ok {
		return nil, 0, fmt.Errorf("%w: %q was never defined", ErrUnknownEventType, name)
	}
	out, err := e.upcast(schemaVersion, data, false)
	return out, e.SchemaVersion, err
}

func (e *typeEntry) upcast(from int, data json.RawMessage, opened bool) (json.RawMessage, error) {
	if from < 1 || from > e.SchemaVersion {
		return nil, fmt.Errorf("%w: %s stored at schema version %d, this program knows 1..%d", ErrInvalidPayload, e.Name, from, e.SchemaVersion)
	}
	if !opened && e.Personal.declared() && IsSealed(data) {
		// Still sealed: read without the key store (a relayed message, a
		// raw row). Personal fields then decode as null, never as
		// ciphertext in a string field.
		var err error
		if data, _, err = Open(data, "", nil); err != nil {
			return nil, err
		}
	}
	for v := from; v < e.SchemaVersion; v++ {
		out, err := e.upcasters[v-1](data)
		if err != nil {
			return nil, fmt.Errorf("%w: upcast %s from v%d: %w", ErrInvalidPayload, e.Name, v, err)
		}
		if !json.Valid(out) {
			return nil, fmt.Errorf("%w: upcast %s from v%d returned invalid JSON", ErrInvalidPayload, e.Name, v)
		}
		data = out
	}
	return data, nil
}
