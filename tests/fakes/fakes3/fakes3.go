// Package fakes3 is a stand-in for the part of S3 that GitLab Runner's distributed cache uses:
// the runner signs URLs for GET and PUT of one object (AWS Signature Version 4, query-string
// form, as minio-go's PresignedGetObject/PresignedPutObject produce them), and the helper binary
// in the job's environment downloads and uploads the cache archive with plain HTTP requests to
// those URLs. Objects live in memory; every request is checked against the signature, the key
// and the expiry, so a URL the runner signed wrongly, for another object or for another method
// fails as it would against S3.
//
// Buckets are path-style: /<bucket>/<object key>. Mount the Server on any mux under "/<bucket>/".
package fakes3

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	algorithm       = "AWS4-HMAC-SHA256"
	amzDateFormat   = "20060102T150405Z"
	unsignedPayload = "UNSIGNED-PAYLOAD"
	// maxExpires is S3's limit for a presigned URL's lifetime (7 days).
	maxExpires = 7 * 24 * time.Hour
	// clockSkew is how far in the future S3 accepts a signing time.
	clockSkew = 15 * time.Minute
	// maxObjectBytes bounds one upload; objects are kept in memory.
	maxObjectBytes = 256 << 20
)

// Server serves one bucket. Create it with New.
type Server struct {
	Bucket    string
	AccessKey string
	SecretKey string
	// Now is the clock the expiry is checked against; time.Now when nil.
	Now func() time.Time

	mu       sync.Mutex
	objects  map[string][]byte
	requests []Request
}

// Request is one request the server answered.
type Request struct {
	Method string
	Key    string
	Status int
}

// New returns a Server for bucket with the given credentials.
func New(bucket, accessKey, secretKey string) *Server {
	return &Server{Bucket: bucket, AccessKey: accessKey, SecretKey: secretKey, objects: map[string][]byte{}}
}

// Object returns the object stored under key.
func (s *Server) Object(key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	data, ok := s.objects[key]
	return slices.Clone(data), ok
}

// Keys lists the stored object keys, sorted.
func (s *Server) Keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.objects))
	for k := range s.objects {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Requests lists the requests answered so far, oldest first.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// ServeHTTP answers presigned GET, HEAD and PUT of objects in the bucket.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key, inBucket := strings.CutPrefix(r.URL.Path, "/"+s.Bucket+"/")
	status := s.serve(w, r, key, inBucket)
	s.mu.Lock()
	s.requests = append(s.requests, Request{Method: r.Method, Key: key, Status: status})
	s.mu.Unlock()
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request, key string, inBucket bool) int {
	if !inBucket || key == "" {
		return writeError(w, http.StatusNotFound, "NoSuchBucket", "no such bucket or no object key")
	}
	if err := s.verify(r); err != nil {
		return writeError(w, http.StatusForbidden, "AccessDenied", err.Error())
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		s.mu.Lock()
		data, ok := s.objects[key]
		s.mu.Unlock()
		if !ok {
			return writeError(w, http.StatusNotFound, "NoSuchKey", "The specified key does not exist.")
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodGet {
			_, _ = w.Write(data)
		}
		return http.StatusOK
	case http.MethodPut:
		data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxObjectBytes))
		if err != nil {
			return writeError(w, http.StatusBadRequest, "IncompleteBody", err.Error())
		}
		s.mu.Lock()
		s.objects[key] = data
		s.mu.Unlock()
		sum := sha256.Sum256(data)
		w.Header().Set("ETag", `"`+hex.EncodeToString(sum[:16])+`"`)
		w.WriteHeader(http.StatusOK)
		return http.StatusOK
	default:
		return writeError(w, http.StatusMethodNotAllowed, "MethodNotAllowed", r.Method+" is not served")
	}
}

// verify checks a query-string (presigned) Signature Version 4 request.
func (s *Server) verify(r *http.Request) error {
	query := r.URL.Query()
	if query.Get("X-Amz-Algorithm") != algorithm {
		return errors.New("not a presigned AWS4-HMAC-SHA256 request")
	}
	credential := strings.Split(query.Get("X-Amz-Credential"), "/")
	if len(credential) != 5 || credential[3] != "s3" || credential[4] != "aws4_request" {
		return fmt.Errorf("malformed X-Amz-Credential %q", query.Get("X-Amz-Credential"))
	}
	if credential[0] != s.AccessKey {
		return errors.New("the access key is not known")
	}
	signed, err := time.Parse(amzDateFormat, query.Get("X-Amz-Date"))
	if err != nil || signed.Format("20060102") != credential[1] {
		return fmt.Errorf("bad X-Amz-Date %q", query.Get("X-Amz-Date"))
	}
	expires, err := strconv.Atoi(query.Get("X-Amz-Expires"))
	if err != nil || expires <= 0 || time.Duration(expires)*time.Second > maxExpires {
		return fmt.Errorf("bad X-Amz-Expires %q", query.Get("X-Amz-Expires"))
	}
	now := time.Now()
	if s.Now != nil {
		now = s.Now()
	}
	if now.Before(signed.Add(-clockSkew)) {
		return errors.New("request signed in the future")
	}
	if now.After(signed.Add(time.Duration(expires) * time.Second)) {
		return errors.New("request has expired")
	}
	want := Signature(s.SecretKey, credential[2], r.Method, r.Host, r.URL.Path, query, r.Header)
	if !hmac.Equal([]byte(want), []byte(query.Get("X-Amz-Signature"))) {
		return errors.New("the request signature we calculated does not match the signature you provided")
	}
	return nil
}

// Signature computes the SigV4 signature of a presigned request: method, host and path as
// sent, query all of X-Amz-* but X-Amz-Signature, header the values of the headers named in
// X-Amz-SignedHeaders other than host.
func Signature(secretKey, region, method, host, path string, query url.Values, header http.Header) string {
	var canonicalQuery []string
	for key, values := range query {
		if key == "X-Amz-Signature" {
			continue
		}
		for _, v := range values {
			canonicalQuery = append(canonicalQuery, uriEncode(key, true)+"="+uriEncode(v, true))
		}
	}
	sort.Strings(canonicalQuery)
	signedHeaders := query.Get("X-Amz-SignedHeaders")
	var canonicalHeaders strings.Builder
	for _, name := range strings.Split(signedHeaders, ";") {
		value := header.Get(name)
		if name == "host" {
			value = host
		}
		fmt.Fprintf(&canonicalHeaders, "%s:%s\n", name, strings.TrimSpace(value))
	}
	canonicalRequest := strings.Join([]string{
		method, uriEncode(path, false), strings.Join(canonicalQuery, "&"),
		canonicalHeaders.String(), signedHeaders, unsignedPayload,
	}, "\n")
	amzDate := query.Get("X-Amz-Date")
	day := amzDate[:min(8, len(amzDate))]
	scope := day + "/" + region + "/s3/aws4_request"
	digest := sha256.Sum256([]byte(canonicalRequest))
	stringToSign := algorithm + "\n" + amzDate + "\n" + scope + "\n" + hex.EncodeToString(digest[:])
	key := []byte("AWS4" + secretKey)
	for _, part := range []string{day, region, "s3", "aws4_request"} {
		key = hmacSHA256(key, part)
	}
	return hex.EncodeToString(hmacSHA256(key, stringToSign))
}

// Presign returns a URL for method on object key that this server accepts until expires has
// passed, as the runner's minio-go client signs it (path style, only the host header signed).
func (s *Server) Presign(method, endpoint, key, region string, at time.Time, expires time.Duration) (string, error) {
	base, err := url.Parse(endpoint)
	if err != nil {
		return "", err
	}
	at = at.UTC()
	query := url.Values{
		"X-Amz-Algorithm":     {algorithm},
		"X-Amz-Credential":    {s.AccessKey + "/" + at.Format("20060102") + "/" + region + "/s3/aws4_request"},
		"X-Amz-Date":          {at.Format(amzDateFormat)},
		"X-Amz-Expires":       {strconv.Itoa(int(expires / time.Second))},
		"X-Amz-SignedHeaders": {"host"},
	}
	path := "/" + s.Bucket + "/" + key
	query.Set("X-Amz-Signature", Signature(s.SecretKey, region, method, base.Host, path, query, nil))
	return base.Scheme + "://" + base.Host + uriEncode(path, false) + "?" + query.Encode(), nil
}

func hmacSHA256(key []byte, data string) []byte {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(data))
	return mac.Sum(nil)
}

// uriEncode is SigV4's UriEncode: every byte but A-Z a-z 0-9 - . _ ~ percent-encoded in upper
// case; "/" too, unless it separates path segments.
func uriEncode(s string, encodeSlash bool) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '.', c == '_', c == '~':
			b.WriteByte(c)
		case c == '/' && !encodeSlash:
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// writeError answers as S3 does: an XML <Error> document.
func writeError(w http.ResponseWriter, status int, code, message string) int {
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	_ = xml.NewEncoder(w).Encode(struct {
		XMLName xml.Name `xml:"Error"`
		Code    string
		Message string
	}{Code: code, Message: message})
	return status
}
