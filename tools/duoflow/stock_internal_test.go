package duoflow

import (
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// srtNetwork is the part of SRT's settings the network_policy fills.
type srtNetwork struct {
	Network struct {
		AllowedDomains      []string `json:"allowedDomains"`
		DeniedDomains       []string `json:"deniedDomains"`
		AllowAllUnixSockets bool     `json:"allowAllUnixSockets"`
	} `json:"network"`
}

// TestSRTSettingsAsTheScriptWritesThem: the settings line of the stock script hands SRT the
// project's network_policy intact, through the shell, even a domain with a quote in it.
func TestSRTSettingsAsTheScriptWritesThem(t *testing.T) {
	policy := NetworkPolicy{
		AllowedDomains:            []string{"it's.example"},
		DeniedDomains:             []string{"10.99.1.7", ProjectDeniedDomain},
		IncludeRecommendedAllowed: true,
		AllowAllUnixSockets:       true,
	}
	out, err := exec.Command("sh", "-c", "echo "+shellQuote(policy.SRTSettings("gitlab.example.com"))).Output()
	if err != nil {
		t.Fatal(err)
	}
	var settings srtNetwork
	if err := json.Unmarshal(out, &settings); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	n := settings.Network
	for _, want := range append([]string{"gitlab.example.com", "*.gitlab.example.com", "it's.example"}, RecommendedDomains...) {
		if !slices.Contains(n.AllowedDomains, want) {
			t.Errorf("allowedDomains %q lacks %q", n.AllowedDomains, want)
		}
	}
	if !slices.Equal(n.DeniedDomains, policy.DeniedDomains) || !n.AllowAllUnixSockets {
		t.Errorf("deniedDomains %q, allowAllUnixSockets %t; want %q, true", n.DeniedDomains, n.AllowAllUnixSockets, policy.DeniedDomains)
	}
}

// TestSRTSettingsOfNoNetworkPolicy: without a network_policy, SRT allows the instance alone,
// denies nothing (an empty list, as GitLab writes it) and blocks Unix sockets.
func TestSRTSettingsOfNoNetworkPolicy(t *testing.T) {
	text := NetworkPolicy{}.SRTSettings("gitlab.example.com")
	var settings srtNetwork
	if err := json.Unmarshal([]byte(text), &settings); err != nil {
		t.Fatal(err)
	}
	n := settings.Network
	if !slices.Equal(n.AllowedDomains, []string{"host.docker.internal", "localhost", "gitlab.example.com", "*.gitlab.example.com"}) ||
		!strings.Contains(text, `"deniedDomains":[]`) || n.AllowAllUnixSockets {
		t.Errorf("settings %s", text)
	}
}
