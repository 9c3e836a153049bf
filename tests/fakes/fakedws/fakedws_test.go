package fakedws_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakedws"
)

// A session expected for a workflow runs its actions in order, stops at the first failure, and
// ends with finish; a wrong token or an unknown workflow is refused before any upgrade.
func TestSessionRunsItsActionsAndStopsAtAFailure(t *testing.T) {
	dws := fakedws.New()
	dws.Expect("7", "secret", fakedws.Action{"action": "run_command", "command": "true"},
		fakedws.Action{"action": "run_command", "command": "false"}, fakedws.Action{"action": "edit_file"})
	srv := httptest.NewServer(dws)
	defer srv.Close()
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + fakedws.Path
	for _, c := range []struct{ query, token string }{{"?workflow_id=7", "wrong"}, {"?workflow_id=8", "secret"}, {"?workflow_id=7", ""}} {
		_, resp, err := websocket.DefaultDialer.Dial(url+c.query, http.Header{"Authorization": {"Bearer " + c.token}})
		if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s with token %q: %v, want 401", c.query, c.token, err)
		}
	}
	conn, _, err := websocket.DefaultDialer.Dial(url+"?workflow_id=7", http.Header{"Authorization": {"Bearer secret"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var got []string
	for {
		var msg map[string]any
		if err := conn.ReadJSON(&msg); err != nil {
			t.Fatal(err)
		}
		got = append(got, msg["action"].(string))
		if msg["action"] == "finish" {
			if msg["summary"] != "stopped: action 2 (run_command) failed" {
				t.Errorf("summary %v", msg["summary"])
			}
			break
		}
		ok := msg["command"] == "true"
		if err := conn.WriteJSON(fakedws.Reply{ID: int(msg["id"].(float64)), OK: ok, Output: "out"}); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close()
	if strings.Join(got, ",") != "run_command,run_command,finish" {
		t.Errorf("actions sent: %v", got)
	}
	sessions := dws.Sessions("7")
	if len(sessions) != 1 || len(sessions[0].Replies) != 2 || sessions[0].Started.IsZero() || dws.Refused() != 3 {
		t.Errorf("sessions %+v, refused %d", sessions, dws.Refused())
	}
}
