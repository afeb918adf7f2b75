package projector

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
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

// SealValue encrypts the JSON value plain of field under key for subject
// and returns the envelope string stored in its place.
func SealValue(key []byte, subject, field string, plain []byte) (string, error) {
	aead, err := newGCM(key)
	if err != nil {
		return "", err
	}
	buf := make([]byte, aead.NonceSize(), aead.NonceSize()+len(plain)+aead.Overhead())
	if _, err := rand.Read(buf); err != nil {
		return "", fmt.Errorf("seal: nonce: %w", err)
	}
	buf = aead.Seal(buf, buf, plain, additional(subject, field))
	return sealedPrefix + base64.RawURLEncoding.EncodeToString(buf), nil
}

// OpenValue decrypts an envelope made by [SealValue] with the same key,
// subject and field, returning the JSON value. Whatever the input, it
// returns an error matching [ErrSealed] rather than panicking or returning
// unauthenticated bytes.
func OpenValue(key []byte, subject, field, envelope string) ([]byte, error) {
	if len(envelope) < len(sealedPrefix) || envelope[:len(sealedPrefix)] != sealedPrefix {
		return nil, fmt.Errorf("%w: not an envelope", ErrSealed)
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(envelope[len(sealedPrefix):])
	if err != nil {
		return nil, fmt.Errorf("%w: envelope encoding: %w", ErrSealed, err)
	}
	aead, err := newGCM(key)
	if err != nil {
		return nil, err
	}
	if len(raw) < aead.NonceSize()+aead.Overhead() {
		return nil, fmt.Errorf("%w: envelope of %d bytes is too short", ErrSealed, len(raw))
	}
	nonce, ct := raw[:aead.NonceSize()], raw[aead.NonceSize():]
	plain, err := aead.Open(nil, nonce, ct, additional(subject, field))
	if err != nil {
		return nil, fmt.Errorf("%w: the key does not open it (a changed key or a tampered row)", ErrSealed)
	}
	return plain, nil
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
	b := make([]byte, 0, len(sealedPrefix)+len(subject)+len(field)+2)
	b = append(b, sealedPrefix...)
	b = append(b, 0)
	b = append(b, subject...)
	b = append(b, 0)
	return append(b, field...)
}
