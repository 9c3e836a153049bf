package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
)

// helperCommand answers whether the runner's helper baked into the pod (--baked, copied from the
// agent image by the init container) is the one the runner expects (--sha256, the runner's own
// helper's), and if so links it as --link, on the stages' PATH: one line, wire.HelperBaked or
// wire.HelperMismatch with the baked file's sha256, or wire.HelperAbsent. The executor copies
// the helper in itself unless the answer is baked.
//
// The baked file's sha256 is the one the init container wrote beside it as it copied it
// (wire.HelperDigestSuffix), when that file holds one: hashing the helper (about 46 MB) in the
// pod costs 0.1 s under gVisor on an idle node and about a second on a loaded one, at prepare,
// in a claimed pod (docs/performance.md). Trusting it is safe: the
// init container writes the digest and the helper together into a volume the job container
// mounts read-only, and this check runs at prepare, before any job script runs in the pod; a
// digest that disagrees with a changed helper could come only from someone who can write that
// volume, who could as well change the helper and its digest together. Without a well-formed
// digest file (an older agent's install, none written), the helper is hashed as before.
func helperCommand(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("helper", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	baked := fs.String("baked", wire.BakedHelperPath, "the baked helper")
	want := fs.String("sha256", "", "the runner's helper's sha256 (hex)")
	link := fs.String("link", "", "where to link it when it matches")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *want == "" || !filepath.IsAbs(*link) || !filepath.IsAbs(*baked) {
		return errors.New("usage: helper --baked PATH --sha256 HEX --link PATH")
	}
	f, err := os.Open(*baked)
	if errors.Is(err, os.ErrNotExist) {
		_, err = fmt.Fprintln(stdout, wire.HelperAbsent)
		return err
	}
	if err != nil {
		return err
	}
	defer f.Close()
	got, ok := recordedDigest(*baked + wire.HelperDigestSuffix)
	if !ok {
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return err
		}
		got = hex.EncodeToString(h.Sum(nil))
	}
	if got != *want {
		_, err = fmt.Fprintln(stdout, wire.HelperMismatch, got)
		return err
	}
	if err := os.MkdirAll(filepath.Dir(*link), 0o700); err != nil {
		return err
	}
	if err := os.Remove(*link); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Symlink(*baked, *link); err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, wire.HelperBaked, got)
	return err
}

// recordedDigest reads the helper's sha256 from path (wire.HelperDigestSuffix): ok only for
// exactly 64 lowercase hex digits, with or without a newline.
func recordedDigest(path string) (digest string, ok bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 2*sha256.Size+2))
	if err != nil {
		return "", false
	}
	digest = strings.TrimSuffix(string(b), "\n")
	if len(digest) != 2*sha256.Size || strings.Trim(digest, "0123456789abcdef") != "" {
		return "", false
	}
	return digest, true
}
