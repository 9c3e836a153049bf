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

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
)

// helperCommand answers whether the runner's helper baked into the pod (--baked, copied from the
// agent image by the init container) is the one the runner expects (--sha256, the runner's own
// helper's), and if so links it as --link, on the stages' PATH: one line, wire.HelperBaked or
// wire.HelperMismatch with the baked file's sha256, or wire.HelperAbsent. The executor copies
// the helper in itself unless the answer is baked.
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
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return err
	}
	got := hex.EncodeToString(h.Sum(nil))
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
