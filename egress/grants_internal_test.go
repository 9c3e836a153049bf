package egress

import (
	"context"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
	"github.com/sandbox-executor/sandbox-executor/egress/allowlist"
)

// A grant made through the admin endpoint opens a destination to that client only, until it is
// deleted or lapses; the proxy names the granted rule in its decisions.
func TestGrantOpensADestinationForItsClientOnly(t *testing.T) {
	s := newStand(t)
	now := t0
	s.proxy.Grants = &Grants{}
	s.proxy.Now = func() time.Time { return now }
	admin := httptest.NewServer(&Admin{Recorder: s.proxy.Recorder, Grants: s.proxy.Grants, Allow: DefaultAdminAllow, Now: func() time.Time { return now }})
	defer admin.Close()
	// The echo upstream is on 127.0.0.1: a literal rule for it, as a job's instance on an IP.
	echo := "127.0.0.1:" + strconv.Itoa(s.echoAddr.Port)
	connect := func() int {
		_, _, resp := s.connect(t, echo, "")
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := connect(); code != 403 {
		t.Fatalf("before the grant: CONNECT %s answered %d, want 403", echo, code)
	}
	ctx := context.Background()
	if err := (&adminclient.Client{Base: admin.URL, HTTP: admin.Client()}).PutGrant(ctx, "127.0.0.1", adminclient.Grant{Allow: []string{echo}, Until: now.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if code := connect(); code != 200 {
		t.Fatalf("with the grant: CONNECT %s answered %d, want 200", echo, code)
	}
	if !strings.Contains(s.log.String(), `"rule":"grant `+echo+`"`) {
		t.Errorf("the decision does not name the grant: %s", s.log.String())
	}
	// Another client's grant does not open anything to this one.
	if _, ok := s.proxy.Grants.Match(netip.MustParseAddr("127.0.0.2"), allowlist.Dest{Host: "127.0.0.1", Addr: netip.MustParseAddr("127.0.0.1"), Port: s.echoAddr.Port}, now); ok {
		t.Error("127.0.0.2 matched 127.0.0.1's grant")
	}
	now = now.Add(time.Minute)
	if code := connect(); code != 403 {
		t.Errorf("after the grant lapsed: CONNECT answered %d, want 403", code)
	}
	now = t0
	if err := (&adminclient.Client{Base: admin.URL, HTTP: admin.Client()}).DeleteGrant(ctx, "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if code := connect(); code != 403 {
		t.Errorf("after DELETE: CONNECT answered %d, want 403", code)
	}
}

func TestGrantRefusals(t *testing.T) {
	g := &Grants{Max: 1}
	client := netip.MustParseAddr("10.88.0.5")
	later := t0.Add(time.Hour)
	for _, c := range []struct {
		grant adminclient.Grant
		want  string
	}{
		{adminclient.Grant{Until: later}, "1 to 16 allowlist entries, not 0"},
		{adminclient.Grant{Allow: []string{"*"}, Until: later}, `allowlist entry "*"`},
		{adminclient.Grant{Allow: []string{"gitlab.example.com"}, Until: t0}, "is not in the future"},
		{adminclient.Grant{Allow: make([]string, MaxGrantRules+1), Until: later}, "not 17"},
	} {
		if err := g.Put(client, c.grant, t0); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Put(%+v) = %v, want %q", c.grant, err, c.want)
		}
	}
	if err := g.Put(client, adminclient.Grant{Allow: []string{"gitlab.example.com"}, Until: later}, t0); err != nil {
		t.Fatal(err)
	}
	other := netip.MustParseAddr("10.88.0.6")
	if err := g.Put(other, adminclient.Grant{Allow: []string{"gitlab.example.com"}, Until: later}, t0); err == nil || !strings.Contains(err.Error(), "the limit") {
		t.Errorf("a second client over Max 1: %v", err)
	}
	// A lapsed grant makes room.
	if err := g.Put(other, adminclient.Grant{Allow: []string{"gitlab.example.com"}, Until: later.Add(time.Hour)}, later); err != nil {
		t.Errorf("after the first grant lapsed: %v", err)
	}
}

func TestAdminGrantsEndpoint(t *testing.T) {
	admin := &Admin{Recorder: &Recorder{}, Grants: &Grants{}, Allow: DefaultAdminAllow, Now: func() time.Time { return t0 }}
	srv := httptest.NewServer(admin)
	defer srv.Close()
	ctx := context.Background()
	if err := (&adminclient.Client{Base: srv.URL, HTTP: srv.Client()}).PutGrant(ctx, "nope", adminclient.Grant{}); err == nil || !strings.Contains(err.Error(), `client="nope" is not an IP address`) {
		t.Errorf("bad client: %v", err)
	}
	if err := (&adminclient.Client{Base: srv.URL, HTTP: srv.Client()}).PutGrant(ctx, "10.88.0.5", adminclient.Grant{Allow: []string{"a.*.example"}, Until: t0.Add(time.Hour)}); err == nil || !strings.Contains(err.Error(), "400 Bad Request: egress proxy admin: grant refused") {
		t.Errorf("bad entry: %v", err)
	}
	// Only trusted sources may grant: a job pod must not widen its own allowlist.
	admin.Allow = nil
	if err := (&adminclient.Client{Base: srv.URL, HTTP: srv.Client()}).PutGrant(ctx, "10.88.0.5", adminclient.Grant{Allow: []string{"gitlab.example.com"}, Until: t0.Add(time.Hour)}); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("untrusted source: %v", err)
	}
	if err := (&adminclient.Client{Base: srv.URL, HTTP: srv.Client()}).DeleteGrant(ctx, "10.88.0.5"); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("untrusted DELETE: %v", err)
	}
}

func TestAdminListsLiveGrants(t *testing.T) {
	now := t0
	admin := &Admin{Recorder: &Recorder{}, Grants: &Grants{}, Allow: DefaultAdminAllow, Now: func() time.Time { return now }}
	srv := httptest.NewServer(admin)
	defer srv.Close()
	ctx := context.Background()
	client := &adminclient.Client{Base: srv.URL, HTTP: srv.Client()}
	for _, g := range []struct {
		client string
		until  time.Duration
	}{{"10.88.0.7", time.Hour}, {"10.88.0.5", time.Minute}} {
		if err := client.PutGrant(ctx, g.client, adminclient.Grant{Instance: []string{"gitlab.example.com:443"}, Until: t0.Add(g.until)}); err != nil {
			t.Fatal(err)
		}
	}
	live, err := client.ListGrants(ctx)
	if err != nil || len(live) != 2 || live[0].Client != "10.88.0.5" || live[1].Client != "10.88.0.7" || !live[1].Until.Equal(t0.Add(time.Hour)) {
		t.Fatalf("live grants %+v, %v; want 10.88.0.5 and 10.88.0.7", live, err)
	}
	now = t0.Add(2 * time.Minute) // the first has lapsed
	if err := client.DeleteGrant(ctx, "10.88.0.7"); err != nil {
		t.Fatal(err)
	}
	if live, err := client.ListGrants(ctx); err != nil || len(live) != 0 {
		t.Errorf("after one lapsed and one withdrawn: %+v, %v; want none", live, err)
	}
	admin.Allow = nil
	if _, err := client.ListGrants(ctx); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("an untrusted source listed the grants: %v", err)
	}
}
