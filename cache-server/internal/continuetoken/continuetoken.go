// Package continuetoken encodes and validates the opaque `continue` value of
// paginated LISTs.
//
// Format. The envelope is kube-apiserver's (k8s.io/apiserver/pkg/storage/
// continue.go): unpadded base64url of the JSON object
//
//	{"v":"meta.k8s.io/v1","rv":<int64>,"start":"<key>"}
//
// so tokens look and decode like the apiserver's, carry the same
// resourceVersion (our RVs are the upstream apiserver's), and any front
// replica can serve them: they hold no server-side state. One deliberate
// difference: "start" is the last key returned (exclusive) in the tier's key
// space (keyhash.Key: "namespace/name" or "name"), where the apiserver stores
// that key plus "\x00" relative to the list's etcd prefix. Keeping the
// namespace in the key lets Decode check that a token is used against the
// namespace it was issued for; clients must treat tokens as opaque anyway.
//
// rv > 0 means "continue from the snapshot at rv". rv == -1 is the
// apiserver's "continue at the latest resourceVersion" value, used by the
// inconsistent token of a 410 (see Expired); Decode reports it as rv 0.
//
// Errors are the apiserver's: 400 BadRequest "invalid continue token:
// continue key is not valid: ..." (storage.ValidateListOptions wraps
// storage.DecodeContinue's errors that way).
package continuetoken

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Version is the only encoding version, the apiserver's.
const Version = "meta.k8s.io/v1"

// latestRV is what the apiserver writes for "continue at the latest RV"
// (etcd3 handleCompactedErrorForPaging); 0 is rejected to tell a bad token
// from that one.
const latestRV = -1

// The decode errors, with the apiserver's texts (storage/continue.go).
var (
	errInvalidStartRV             = errors.New("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
	errEmptyStartKey              = errors.New("continue key is not valid: encoded start key empty (version meta.k8s.io/v1)")
	errGenericInvalidKey          = errors.New("continue key is not valid")
	errUnrecognizedEncodedVersion = errors.New("continue key is not valid: server does not recognize this encoded version")
)

// continueToken has the apiserver's name, field names and types so that
// encoding/json's errors (which quote them, e.g. "cannot unmarshal string
// into Go struct field continueToken.rv of type int64") read the same.
type continueToken struct {
	APIVersion      string `json:"v"`
	ResourceVersion int64  `json:"rv"`
	StartKey        string `json:"start"`
	// Remaining and Scope are the tier's own (see EncodeCounted): how many
	// items followed StartKey in the issuing list, and that list's key
	// prefix.
	Remaining *int64  `json:"rem,omitempty"`
	Scope     *string `json:"scope,omitempty"`
}

// Token is a decoded continue token.
type Token struct {
	// RV is the snapshot to continue from; 0 = the latest (a 410's token).
	RV uint64
	// LastKey is the key to resume after.
	LastKey string
	// Remaining is the number of items after LastKey in the snapshot, as
	// the issuing page computed it; -1 when the token does not say (or says
	// it for another scope).
	Remaining int64
}

// Encode returns the token that resumes a list at snapshot rv after lastKey
// (store.ListResult.ContinueKey). rv must be > 0 and fit in an int64, as any
// resourceVersion the apiserver hands out does.
func Encode(rv uint64, lastKey string) string {
	return encode(int64(rv), lastKey)
}

// EncodeCounted is Encode for a page that knows how many items follow
// lastKey in its snapshot (an unfiltered page: remainingItemCount). The next
// page then computes its own count by subtraction instead of walking the
// rest of the list again: remainingItemCount is O(remaining) to count
// (google/btree keeps no subtree sizes), which made it ~10% of a paginated
// walk's CPU. keyPrefix is the list's scope; Decode ignores the count of a
// token used against another scope. The count is a hint the client hands
// back: one it edited changes only its own remainingItemCount (the store
// recounts a count that cannot be right), never which items it gets.
func EncodeCounted(rv uint64, lastKey, keyPrefix string, remaining int64) string {
	return marshal(&continueToken{APIVersion: Version, ResourceVersion: int64(rv), StartKey: lastKey, Remaining: &remaining, Scope: &keyPrefix})
}

func encode(rv int64, lastKey string) string {
	return marshal(&continueToken{APIVersion: Version, ResourceVersion: rv, StartKey: lastKey})
}

func marshal(c *continueToken) string {
	// Marshal cannot fail for a struct of strings and ints.
	out, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(out)
}

// Decode validates token for a list over keyPrefix (keyhash.NamespacePrefix:
// "namespace/" or "" for all namespaces / cluster-scoped) and returns the
// snapshot RV (0 = the latest, from a 410's inconsistent token) and the key
// to resume after. Any error is a *StatusError 400 BadRequest.
func Decode(token, keyPrefix string) (Token, error) {
	t, err := decode(token, keyPrefix)
	if err != nil {
		return Token{}, apierrors.NewBadRequest(fmt.Sprintf("invalid continue token: %v", err))
	}
	return t, nil
}

func decode(token, keyPrefix string) (Token, error) {
	data, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return Token{}, fmt.Errorf("%w: %v", errGenericInvalidKey, err)
	}
	var c continueToken
	if err := json.Unmarshal(data, &c); err != nil {
		return Token{}, fmt.Errorf("%w: %v", errGenericInvalidKey, err)
	}
	if c.APIVersion != Version {
		return Token{}, fmt.Errorf("%w %v", errUnrecognizedEncodedVersion, c.APIVersion)
	}
	if c.ResourceVersion == 0 {
		return Token{}, errInvalidStartRV
	}
	if len(c.StartKey) == 0 {
		return Token{}, errEmptyStartKey
	}
	if !validKey(c.StartKey, keyPrefix) {
		return Token{}, fmt.Errorf("%w: %v", errGenericInvalidKey, c.StartKey)
	}
	if c.ResourceVersion < 0 {
		// The apiserver treats any negative RV as "latest", not only -1
		// (cacher ShouldDelegateContinue: "continue with negative RV is a
		// consistent read"). A count is about the token's snapshot, not
		// the latest state: never kept.
		return Token{LastKey: c.StartKey, Remaining: -1}, nil
	}
	t := Token{RV: uint64(c.ResourceVersion), LastKey: c.StartKey, Remaining: -1}
	if c.Remaining != nil && *c.Remaining >= 0 && c.Scope != nil && *c.Scope == keyPrefix {
		t.Remaining = *c.Remaining
	}
	return t, nil
}

// validKey keeps a client-supplied key inside the listed range: it must be a
// clean relative path (no "..", ".", empty segments or leading slash, the
// apiserver's path.Clean test), lie under keyPrefix, and have the shape of a
// key in it ("name" or "namespace/name" for keyPrefix "", "name" after a
// namespace prefix).
func validKey(key, keyPrefix string) bool {
	if path.Clean("/"+key) != "/"+key {
		return false
	}
	rest, ok := strings.CutPrefix(key, keyPrefix)
	if !ok || rest == "" {
		return false
	}
	if keyPrefix != "" {
		return !strings.Contains(rest, "/")
	}
	return strings.Count(rest, "/") <= 1
}

// The apiserver's 410 texts (k8s.io/apiserver/pkg/storage/etcd3/errors.go).
const inconsistentContinue = "The provided continue parameter is too old " +
	"to display a consistent list result. You can start a new list without " +
	"the continue parameter, or use the continue token in this response to " +
	"retrieve the remainder of the results. Continuing with the provided " +
	"token results in an inconsistent list - objects that were created, " +
	"modified, or deleted between the time the first chunk was returned " +
	"and now may show up in the list."

// Expired is the error for a continue token whose snapshot left the history
// window: 410 Expired, and in the Status's ListMeta.continue a token that
// resumes after the same key at the latest resourceVersion, exactly as the
// apiserver answers when etcd compacted the token's revision.
func Expired(lastKey string) *apierrors.StatusError {
	err := apierrors.NewResourceExpired(inconsistentContinue)
	err.ErrStatus.ListMeta.Continue = encode(latestRV, lastKey)
	return err
}
