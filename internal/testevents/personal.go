package testevents

import (
	"crypto/sha256"

	"github.com/projectorhq/projector"
)

// CustomerRegistered carries two personal fields (Name, Email) of the data
// subject Customer, and one that is not personal (Plan).
type CustomerRegistered struct {
	Customer string `json:"customer"`
	Name     string `json:"name"`
	Email    string `json:"email"`
	Plan     string `json:"plan"`
}

// CustomerPlain is CustomerRegistered without a personal declaration: the
// baseline benchmarks compare against.
type CustomerPlain struct {
	Customer string `json:"customer"`
	Name     string `json:"name"`
	Email    string `json:"email"`
	Plan     string `json:"plan"`
}

// PersonalTypes are the handles of a registry with personal data.
type PersonalTypes struct {
	Registry   *projector.Registry
	Registered projector.EventType[CustomerRegistered]
	Plain      projector.EventType[CustomerPlain]
}

// NewPersonal defines CustomerRegistered (personal: name and email, subject
// customer, sealed in one envelope kept apart from the payload: the form a
// deployment of this release turns on) and CustomerPlain in a fresh
// registry.
func NewPersonal() PersonalTypes {
	r := projector.NewRegistry()
	return PersonalTypes{
		Registry: r,
		Registered: projector.MustDefine[CustomerRegistered](r, "customer.registered", projector.TypeConfig{
			Personal: projector.Personal{Subject: "customer", Fields: []string{"name", "email"}, OneEnvelope: true, EnvelopeApart: true},
		}),
		Plain: projector.MustDefine[CustomerPlain](r, "customer.plain_registered"),
	}
}

// MasterKey returns a fixed test master key material of 32 bytes derived
// from seed, so a test can make "the same" and "a changed" key.
func MasterKey(seed string) []byte {
	sum := sha256.Sum256([]byte("projector test master key " + seed))
	return sum[:]
}
