package saga

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// sealedValue matches a sealed field's value in stored JSON, in either
// form: "pjx1.<base64url>" (an envelope per field), "pjx2.<base64url>" (the
// event's one envelope) or "pjx2." (a field kept in it).
var sealedValue = regexp.MustCompile(`"pjx[12]\.[A-Za-z0-9_=-]*"`)

// SealedMarker is what [OpenState] shows in place of a sealed field it
// cannot open.
const SealedMarker = `"(sealed)"`

// OpenState opens the sealed personal fields of a shown instance's state
// (see [Config.Personal]) in place, with the saga's declaration p and the
// store's master key, and says what it did, for an operator: "" when the
// state holds nothing sealed. A forgotten subject's fields read as null.
// When the fields cannot be opened — p declares nothing (undeclared says
// why the caller has no declaration), no master key, a master key that
// does not open the subject's key — each one is shown as [SealedMarker]
// and the note says why: the envelopes mean nothing to an operator, and
// nothing of the state is ever shown garbled. Other errors (the key table
// cannot be read) are returned, the state left as it was.
func OpenState(ctx context.Context, store *postgres.Store, in *InstanceDetail, p projector.Personal, undeclared string) (string, error) {
	if !projector.IsSealed(in.State) {
		return "", nil
	}
	mask := func(why string) (string, error) {
		in.State = sealedValue.ReplaceAll(in.State, []byte(SealedMarker))
		return "sealed, not shown: " + why, nil
	}
	if p.Subject == "" {
		return mask(undeclared)
	}
	opened, forgotten, err := store.OpenData(ctx, store.Pool(), in.Tenant, p, in.State)
	switch {
	case errors.Is(err, postgres.ErrNoMasterKey):
		return mask("no master key (set " + postgres.MasterKeyEnv + " to show them)")
	case errors.Is(err, postgres.ErrMasterKeyChanged):
		_, why, _ := strings.Cut(err.Error(), postgres.ErrMasterKeyChanged.Error()+": ")
		return mask("master key changed: " + why)
	case err != nil:
		return "", err
	}
	in.State = opened
	subject, _ := p.SubjectOf(opened)
	if forgotten {
		return fmt.Sprintf("forgotten: subject %s was forgotten, its fields %s read as null", projector.Printable(subject), strings.Join(p.Fields, ", ")), nil
	}
	return fmt.Sprintf("opened: fields %s of subject %s", strings.Join(p.Fields, ", "), projector.Printable(subject)), nil
}
