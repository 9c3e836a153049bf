package allowlist

import (
	"strings"
	"testing"
)

func TestInstanceRules(t *testing.T) {
	for _, c := range []struct {
		url, host string
		wildcard  bool
		want      string
		err       string
	}{
		{"https://gitlab.example.com", "gitlab.example.com", false, "gitlab.example.com:80 gitlab.example.com:443", ""},
		{"https://GitLab.Example.com/", "", true, "gitlab.example.com:80 gitlab.example.com:443 *.gitlab.example.com:80 *.gitlab.example.com:443", ""},
		{"http://10.99.1.7:8080", "10.99.1.7", true, "10.99.1.7:80 10.99.1.7:443 10.99.1.7:8080", ""},
		{"https://[2001:db8::1]", "", true, "[2001:db8::1]:80 [2001:db8::1]:443", ""},
		{"", "", false, "", "no CI_SERVER_URL"},
		{"gitlab.example.com", "", false, "", "is not an http(s) URL"},
		{"ftp://gitlab.example.com", "", false, "", "is not an http(s) URL"},
		{"https://gitlab.example.com", "evil.example", false, "", `CI_SERVER_HOST "evil.example" is not the host of CI_SERVER_URL`},
		{"https://bad_host!/", "", false, "", `"bad_host!" is not a valid host name`},
	} {
		got, err := InstanceRules(c.url, c.host, c.wildcard)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("InstanceRules(%q, %q) = %v, %v; want error %q", c.url, c.host, got, err, c.err)
			}
			continue
		}
		if err != nil || strings.Join(got, " ") != c.want {
			t.Errorf("InstanceRules(%q, %q, %t) = %q, %v; want %q", c.url, c.host, c.wildcard, got, err, c.want)
		}
	}
}
