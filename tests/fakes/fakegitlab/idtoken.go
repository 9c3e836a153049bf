package fakegitlab

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"time"
)

// NewIDToken is an ID token shaped as GitLab makes one for an id_tokens entry (in .gitlab-ci.yml,
// and in agent-config.yml since GitLab 19.2), which reaches the runner as a masked variable of
// the entry's name: a JWT whose claims are GitLab's (issuer,
// audience, the project and ref as subject, a unique jti, an hour's validity) and whose
// signature is random: the tests check where a token goes, never its signature.
func NewIDToken(issuer, aud, subject string, now time.Time) (string, error) {
	jti := make([]byte, 16)
	signature := make([]byte, 256) // RS256 with GitLab's 2048-bit key
	if _, err := rand.Read(jti); err != nil {
		return "", err
	}
	if _, err := rand.Read(signature); err != nil {
		return "", err
	}
	claims, err := json.Marshal(map[string]any{
		"iss": issuer, "aud": aud, "sub": subject,
		"jti": hex.EncodeToString(jti), "iat": now.Unix(), "nbf": now.Unix() - 5, "exp": now.Add(time.Hour).Unix(),
	})
	if err != nil {
		return "", err
	}
	enc := base64.RawURLEncoding
	return enc.EncodeToString([]byte(`{"kid":"fakegitlab","typ":"JWT","alg":"RS256"}`)) + "." + enc.EncodeToString(claims) + "." + enc.EncodeToString(signature), nil
}
