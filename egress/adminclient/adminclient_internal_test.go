package adminclient

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// The client sends the token when it has one, and a refusal is a RefusedError: the call made
// nothing.
func TestClientSendsTheBearerToken(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Authorization"))
		if r.Header.Get("Authorization") == "" {
			http.Error(w, "egress proxy admin: forbidden", http.StatusForbidden)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	ctx := context.Background()
	withToken := &Client{Base: srv.URL, Token: "a-token-of-32-characters-or-so!!"}
	if err := withToken.PutGrant(ctx, "10.88.0.5", Grant{Allow: []string{"x.example"}, Until: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	err := (&Client{Base: srv.URL}).DeleteGrant(ctx, "10.88.0.5")
	var refused *RefusedError
	if !errors.As(err, &refused) || err.Error() != "403 Forbidden: egress proxy admin: forbidden" {
		t.Errorf("without a token: %v, want a RefusedError", err)
	}
	if len(got) != 2 || got[0] != "Bearer a-token-of-32-characters-or-so!!" || got[1] != "" {
		t.Errorf("Authorization headers sent: %q", got)
	}
}
