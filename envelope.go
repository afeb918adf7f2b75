package projector

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
)

// A sealed field is stored as a JSON string:
//
//	"pjx1." + base64url(nonce ‖ AES-256-GCM ciphertext ‖ tag)
//
// The nonce is 12 random bytes, fresh for every field of every event; the
// additional data binds the ciphertext to its subject and field name, so an
// envelope copied into another subject's event or another field does not
// open. The key is the subject's 32-byte data key.
const sealedPrefix = "pjx1."

// DataKeySize is the size of a data subject's key: AES-256.
const DataKeySize = 32

// ErrSealed: a sealed personal field could not be opened — the envelope is
// malformed, or it was not sealed with the key given (a wrong or changed
// key, or a tampered row). Never returned for a forgotten subject, whose
// fields decode as null.
var ErrSealed = errors.New("projector: sealed field does not open")

// NewDataKey returns a fresh random data key.
func NewDataKey() ([]byte, error) {
	k := make([]byte, DataKeySize)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("new data key: %w", err)
	}
	return k, nil
}

// KeyCipher is a data key set up to seal and open fields: the AES key
// schedule and GCM are made once, where [SealValue] and [OpenValue] make
// them per call. A store keeps one beside each key it caches. It is safe
// for concurrent use.
type KeyCipher struct{ aead cipher.AEAD }

// The sizes of GCM's nonce and tag as cipher.NewGCM makes it, constants
// here: asked of the AEAD through its interface they were two dynamic
// calls per size per field opened, about 0.08 µs an event of a sealed
// read's opening (docs/performance.md). NewKeyCipher checks them.
const (
	gcmNonceSize = 12
	gcmTagSize   = 16
)

// NewKeyCipher returns the cipher of a 32-byte data key.
func NewKeyCipher(key []byte) (*KeyCipher, error) {
	aead, err := newGCM(key)
	if err != nil {
		return nil, err
	}
	if aead.NonceSize() != gcmNonceSize || aead.Overhead() != gcmTagSize {
		return nil, fmt.Errorf("%w: GCM with a %d-byte nonce and a %d-byte tag, want %d and %d", ErrSealed, aead.NonceSize(), aead.Overhead(), gcmNonceSize, gcmTagSize)
	}
	return &KeyCipher{aead: aead}, nil
}

// SealValue encrypts the JSON value plain of field under key for subject
// and returns the envelope string stored in its place.
func SealValue(key []byte, subject, field string, plain []byte) (string, error) {
	c, err := NewKeyCipher(key)
	if err != nil {
		return "", err
	}
	return c.SealValue(subject, field, plain)
}

// SealValue is [SealValue] under c's key.
func (c *KeyCipher) SealValue(subject, field string, plain []byte) (string, error) {
	buf := make([]byte, gcmNonceSize, gcmNonceSize+len(plain)+gcmTagSize)
	if _, err := rand.Read(buf); err != nil {
		return "", fmt.Errorf("seal: nonce: %w", err)
	}
	buf = c.aead.Seal(buf, buf, plain, additional(subject, field))
	return sealedPrefix + base64.RawURLEncoding.EncodeToString(buf), nil
}

// appendSealed appends the envelope of plain, field's JSON value, as a
// JSON string (quotes included: the envelope's alphabet needs no escapes)
// to dst, with scratch for the nonce, ciphertext and additional data
// (grown as needed, and returned for the next field). It is SealValue
// without the three allocations per field of a fresh buffer, the envelope
// string and its quoting: the sealed-append path's.
func (c *KeyCipher) appendSealed(dst []byte, subject string, field, plain, scratch []byte) (out, scratchOut []byte, err error) {
	ns, sealed := gcmNonceSize, gcmNonceSize+len(plain)+gcmTagSize
	if need := sealed + len(sealedPrefix) + len(subject) + len(field) + 2; cap(scratch) < need {
		scratch = make([]byte, need+64)
	}
	scratch = scratch[:cap(scratch)]
	// The ciphertext may not overlap the additional data: it goes after
	// the sealed bytes, and the nonce's slice is capped at their end.
	ad := appendAdditional(scratch[sealed:sealed], subject, field)
	nonce := scratch[:ns:sealed]
	if _, err := rand.Read(nonce); err != nil {
		return dst, scratch, fmt.Errorf("seal: nonce: %w", err)
	}
	raw := c.aead.Seal(nonce, nonce, plain, ad)
	dst = append(dst, '"')
	dst = append(dst, sealedPrefix...)
	dst = base64.RawURLEncoding.AppendEncode(dst, raw)
	return append(dst, '"'), scratch, nil
}

// strictBase64 decodes envelopes: made once, where Strict() copies the
// whole Encoding on every call. It is never modified.
var strictBase64 = base64.RawURLEncoding.Strict()

// scratchPool holds the buffers envelopes are sealed and opened in, so a
// payload's fields cost no allocation of their own: each result is copied
// into the payload before the buffer is used again.
var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// scratch is what one seal or open of a payload borrows: the crypto's
// buffer and, for a seal, the envelope's text.
type scratch struct{ crypto, text []byte }

// OpenValue decrypts an envelope made by [SealValue] with the same key,
// subject and field, returning the JSON value. Whatever the input, it
// returns an error matching [ErrSealed] rather than panicking or returning
// unauthenticated bytes.
func OpenValue(key []byte, subject, field, envelope string) ([]byte, error) {
	c, err := NewKeyCipher(key)
	if err != nil {
		return nil, err
	}
	return c.OpenValue(subject, field, envelope)
}

// OpenValue is [OpenValue] under c's key.
func (c *KeyCipher) OpenValue(subject, field, envelope string) ([]byte, error) {
	plain, _, err := c.open(subject, []byte(field), []byte(envelope), nil)
	return plain, err
}

// open opens envelope in buf (grown as needed, and returned for the next
// field): the envelope is decoded into it, the additional data written
// after, and the plaintext decrypted in place. The plaintext is valid
// until buf is used again.
func (c *KeyCipher) open(subject string, field, envelope, buf []byte) (plain, scratch []byte, err error) {
	if !bytes.HasPrefix(envelope, []byte(sealedPrefix)) {
		return nil, buf, fmt.Errorf("%w: not an envelope", ErrSealed)
	}
	enc := envelope[len(sealedPrefix):]
	size := base64.RawURLEncoding.DecodedLen(len(enc))
	if need := size + len(sealedPrefix) + len(subject) + len(field) + 2; cap(buf) < need {
		buf = make([]byte, need+64)
	}
	raw := buf[:size]
	n, err := strictBase64.Decode(raw, enc)
	if err != nil {
		return nil, buf, fmt.Errorf("%w: envelope encoding: %w", ErrSealed, err)
	}
	raw = raw[:n]
	if len(raw) < gcmNonceSize+gcmTagSize {
		return nil, buf, fmt.Errorf("%w: envelope of %d bytes is too short", ErrSealed, len(raw))
	}
	ad := appendAdditional(buf[size:size], subject, field)
	nonce, ct := raw[:gcmNonceSize], raw[gcmNonceSize:]
	plain, err = c.aead.Open(ct[:0], nonce, ct, ad)
	if err != nil {
		return nil, buf, fmt.Errorf("%w: the key does not open it (a changed key or a tampered row)", ErrSealed)
	}
	return plain, buf, nil
}

func newGCM(key []byte) (cipher.AEAD, error) {
	if len(key) != DataKeySize {
		return nil, fmt.Errorf("%w: a data key is %d bytes, got %d", ErrSealed, DataKeySize, len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSealed, err)
	}
	return cipher.NewGCM(block)
}

// additional is the GCM additional data: the envelope version, subject and
// field, NUL-separated (neither can hold a NUL).
func additional(subject, field string) []byte {
	return appendAdditional(make([]byte, 0, len(sealedPrefix)+len(subject)+len(field)+2), subject, []byte(field))
}

func appendAdditional(b []byte, subject string, field []byte) []byte {
	b = append(b, sealedPrefix...)
	b = append(b, 0)
	b = append(b, subject...)
	b = append(b, 0)
	return append(b, field...)
}
