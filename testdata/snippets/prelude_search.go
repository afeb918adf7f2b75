package snippets

import "github.com/projectorhq/projector/search"

// The request's tenant.
var tenant string

// The search projection of the page's first block.
var tickets *search.Projection
