// Package fakedws is a stand-in for the Duo Workflow Service as a flow's duo CLI meets it: a
// WebSocket endpoint on the GitLab instance (GET /api/v4/ai/duo_workflows/ws, the path the CLI
// connects to with --connection-type websocket) that authenticates the session with the flow's
// OAuth token, sends it the agent's actions one at a time, and records each answer. The CLI's
// side is tests/duocli/duo.js.
package fakedws

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// Path is where the instance serves the workflow service's WebSocket.
const Path = "/api/v4/ai/duo_workflows/ws"

// Action is one step the service asks the CLI to take: {"action": "run_command", "command":
// ...}, {"action": "edit_file", "path", "old", "new"}, {"action": "create_merge_request",
// "source_branch", "target_branch", "title"}. The service adds "id" and ends with "finish".
type Action map[string]any

// Reply is the CLI's answer to an action.
type Reply struct {
	ID     int    `json:"id"`
	OK     bool   `json:"ok"`
	Output string `json:"output"`
}

// Session is one connection: the workflow it named, when it began, the answers it gave, and
// whether it got to the end.
type Session struct {
	WorkflowID string
	Started    time.Time
	Replies    []Reply
	Finished   bool
}

// Service serves the sessions it expects. Create it with New.
type Service struct {
	upgrader websocket.Upgrader

	mu       sync.Mutex
	expected map[string]expectation
	sessions []Session
	refused  int
}

type expectation struct {
	token   string
	actions []Action
}

// New is a service that expects no session yet.
func New() *Service { return &Service{expected: map[string]expectation{}} }

// Expect makes the service accept a session for workflowID authenticated with
// "Authorization: Bearer <token>", which takes the actions in order and stops at the first
// that fails. GitLab creates the workflow before the flow's job runs, as this does.
func (s *Service) Expect(workflowID, token string, actions ...Action) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expected[workflowID] = expectation{token: token, actions: actions}
}

// Sessions are the sessions of workflowID so far, in the order they began.
func (s *Service) Sessions(workflowID string) []Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Session
	for _, session := range s.sessions {
		if session.WorkflowID == workflowID {
			session.Replies = append([]Reply(nil), session.Replies...)
			out = append(out, session)
		}
	}
	return out
}

// Refused counts connections refused for a missing or wrong token.
func (s *Service) Refused() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused
}

// ServeHTTP implements http.Handler.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	workflowID := r.URL.Query().Get("workflow_id")
	s.mu.Lock()
	want, known := s.expected[workflowID]
	if !known || want.token == "" || r.Header.Get("Authorization") != "Bearer "+want.token {
		s.refused++
		s.mu.Unlock()
		http.Error(w, "401 Unauthorized", http.StatusUnauthorized)
		return
	}
	s.mu.Unlock()
	started := time.Now()
	conn, err := s.upgrader.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader has answered
	}
	defer conn.Close()
	s.mu.Lock()
	index := len(s.sessions)
	s.sessions = append(s.sessions, Session{WorkflowID: workflowID, Started: started})
	s.mu.Unlock()
	summary := fmt.Sprintf("%d actions done", len(want.actions))
	for i, action := range want.actions {
		msg := Action{"id": i + 1}
		for k, v := range action {
			msg[k] = v
		}
		var reply Reply
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Minute))
		if err := conn.WriteJSON(msg); err != nil {
			return
		}
		if err := conn.ReadJSON(&reply); err != nil {
			return
		}
		s.mu.Lock()
		s.sessions[index].Replies = append(s.sessions[index].Replies, reply)
		s.mu.Unlock()
		if !reply.OK || reply.ID != i+1 {
			summary = fmt.Sprintf("stopped: action %d (%v) failed", i+1, action["action"])
			break
		}
	}
	if err := conn.WriteJSON(Action{"action": "finish", "summary": summary}); err != nil {
		return
	}
	s.mu.Lock()
	s.sessions[index].Finished = true
	s.mu.Unlock()
	// The CLI closes the session; wait for that (or for it to go away) before hanging up.
	_, _, _ = conn.ReadMessage()
}
