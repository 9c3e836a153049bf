package fakes3_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakes3"
)

// The presigned GET example of AWS's Signature Version 4 documentation ("Authenticating
// Requests: Using Query Parameters"): a known answer the verifier must reproduce.
func TestSignatureMatchesAWSExample(t *testing.T) {
	query := url.Values{
		"X-Amz-Algorithm":     {"AWS4-HMAC-SHA256"},
		"X-Amz-Credential":    {"AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request"},
		"X-Amz-Date":          {"20130524T000000Z"},
		"X-Amz-Expires":       {"86400"},
		"X-Amz-SignedHeaders": {"host"},
	}
	got := fakes3.Signature("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "us-east-1", "GET", "examplebucket.s3.amazonaws.com", "/test.txt", query, nil)
	if want := "aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"; got != want {
		t.Errorf("signature %s, want AWS's %s", got, want)
	}
}

func do(t *testing.T, method, rawURL, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, rawURL, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

func TestPresignedPutThenGet(t *testing.T) {
	s3 := fakes3.New("runner-cache", "AKIDCACHE", "cache-secret")
	server := httptest.NewServer(s3)
	defer server.Close()
	now := time.Now()
	key := "runner/abcd1234/project/1/node modules+1"
	put, _ := s3.Presign(http.MethodPut, server.URL, key, "us-east-1", now, time.Hour)
	get, _ := s3.Presign(http.MethodGet, server.URL, key, "us-east-1", now, time.Hour)

	if status, body := do(t, http.MethodGet, get, ""); status != http.StatusNotFound || !strings.Contains(body, "NoSuchKey") {
		t.Errorf("GET before PUT: %d %s, want 404 NoSuchKey", status, body)
	}
	if status, body := do(t, http.MethodPut, put, "cache archive"); status != http.StatusOK {
		t.Fatalf("PUT: %d %s", status, body)
	}
	if status, body := do(t, http.MethodGet, get, ""); status != http.StatusOK || body != "cache archive" {
		t.Errorf("GET: %d %q", status, body)
	}
	if data, ok := s3.Object(key); !ok || string(data) != "cache archive" {
		t.Errorf("Object(%q) = %q, %v", key, data, ok)
	}
	if got := s3.Keys(); len(got) != 1 || got[0] != key {
		t.Errorf("Keys() = %q", got)
	}
	requests := s3.Requests()
	if len(requests) != 3 || requests[1].Method != http.MethodPut || requests[1].Key != key || requests[2].Status != http.StatusOK {
		t.Errorf("Requests() = %+v", requests)
	}
}

func TestRefusesWhatS3Refuses(t *testing.T) {
	s3 := fakes3.New("runner-cache", "AKIDCACHE", "cache-secret")
	server := httptest.NewServer(s3)
	defer server.Close()
	now := time.Now()
	put, _ := s3.Presign(http.MethodPut, server.URL, "k", "us-east-1", now, time.Hour)
	if status, _ := do(t, http.MethodPut, put, "v"); status != http.StatusOK {
		t.Fatalf("control: a well-signed PUT answered %d", status)
	}
	get, _ := s3.Presign(http.MethodGet, server.URL, "k", "us-east-1", now, time.Hour)
	expired, _ := s3.Presign(http.MethodGet, server.URL, "k", "us-east-1", now.Add(-2*time.Hour), time.Hour)
	wrongSecret, _ := fakes3.New("runner-cache", "AKIDCACHE", "other").Presign(http.MethodGet, server.URL, "k", "us-east-1", now, time.Hour)
	otherKey := strings.Replace(get, "/runner-cache/k?", "/runner-cache/k2?", 1)
	for _, tc := range []struct {
		name, method, url string
		status            int
		code              string
	}{
		{"a GET URL used for PUT", http.MethodPut, get, http.StatusForbidden, "AccessDenied"},
		{"expired", http.MethodGet, expired, http.StatusForbidden, "expired"},
		{"signed with another secret", http.MethodGet, wrongSecret, http.StatusForbidden, "does not match"},
		{"signed for another key", http.MethodGet, otherKey, http.StatusForbidden, "does not match"},
		{"unsigned", http.MethodGet, server.URL + "/runner-cache/k", http.StatusForbidden, "not a presigned"},
		{"another bucket", http.MethodGet, strings.Replace(get, "/runner-cache/", "/other/", 1), http.StatusNotFound, "NoSuchBucket"},
	} {
		if status, body := do(t, tc.method, tc.url, "x"); status != tc.status || !strings.Contains(body, tc.code) {
			t.Errorf("%s: %d %s, want %d %s", tc.name, status, body, tc.status, tc.code)
		}
	}
	if data, _ := s3.Object("k"); string(data) != "v" {
		t.Errorf("a refused PUT changed the object: %q", data)
	}
}
