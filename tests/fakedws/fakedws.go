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

// Session is one connection: the workflow it named, the answers it gave, and whether it got to
// the end.
type Session struct {
	WorkflowID string
	Replies    []Reply
	Finished   bool
}

// Service serves the sessions. Create it with New.
type Service struct {
	token    string
	actions  []Action
	upgrader websocket.Upgrader

	mu       sync.Mutex
	sessions []Session
	refused  int
}

// New serves sessions authenticated with "Authorization: Bearer <token>", each taking the
// actions in order and stopping at the first that fails.
func New(token string, actions ...Action) *Service {
	return &Service{token: token, actions: actions}
}

// Sessions are the sessions so far, in the order they began.
func (s *Service) Sessions() []Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Session, len(s.sessions))
	for i, session := range s.sessions {
		out[i] = session
		out[i].Replies = append([]Reply(nil), session.Replies...)
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
	if r.Header.Get("Authorization") != "Bearer "+s.token {
		s.mu.Lock()
		s.refused++
		s.mu.Unlock()
		http.Error(w, "401 Unauthorized", http.StatusUnauthorized)
		return
	}
	conn, err := s.upgrader.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader has answered
	}
	defer conn.Close()
	s.mu.Lock()
	index := len(s.sessions)
	s.sessions = append(s.sessions, Session{WorkflowID: r.URL.Query().Get("workflow_id")})
	s.mu.Unlock()
	summary := fmt.Sprintf("%d actions done", len(s.actions))
	for i, action := range s.actions {
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
