package fakegitlab_test

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
)

func TestNewIDTokenIsAJWTWithGitLabsClaims(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	token, err := fakegitlab.NewIDToken("https://gitlab.example.com", "https://vault.example.com", "project_path:group/project:ref_type:branch:ref:main", now)
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("%q: %d parts, want header.claims.signature", token, len(parts))
	}
	var header, claims map[string]any
	for i, into := range []*map[string]any{&header, &claims} {
		data, err := base64.RawURLEncoding.DecodeString(parts[i])
		if err != nil {
			t.Fatalf("part %d: %v", i, err)
		}
		if err := json.Unmarshal(data, into); err != nil {
			t.Fatalf("part %d: %v", i, err)
		}
	}
	if header["alg"] != "RS256" || header["typ"] != "JWT" {
		t.Errorf("header %v", header)
	}
	if claims["iss"] != "https://gitlab.example.com" || claims["aud"] != "https://vault.example.com" ||
		claims["sub"] != "project_path:group/project:ref_type:branch:ref:main" || claims["iat"] != float64(now.Unix()) || claims["exp"] != float64(now.Add(time.Hour).Unix()) {
		t.Errorf("claims %v", claims)
	}
	if signature, err := base64.RawURLEncoding.DecodeString(parts[2]); err != nil || len(signature) != 256 {
		t.Errorf("signature: %d bytes, %v", len(signature), err)
	}
	again, err := fakegitlab.NewIDToken("https://gitlab.example.com", "https://vault.example.com", "project_path:group/project:ref_type:branch:ref:main", now)
	if err != nil || again == token {
		t.Errorf("two tokens for the same claims: %v, equal %v (each has a jti and signature of its own)", err, again == token)
	}
}
