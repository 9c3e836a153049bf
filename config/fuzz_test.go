package config_test

import (
	"os"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/config"
)

// FuzzParse: no config text, however malformed, panics the executor; it loads or is an error.
func FuzzParse(f *testing.F) {
	example, err := os.ReadFile("../config.toml.example")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(example)
	f.Add([]byte("namespace = \"ci\"\nrunner_name = \"r\"\ndefault_pool = \"p\"\n[[pools]]\nname = \"p\"\nimages = [\"*\"]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := config.Parse("fuzz.toml", data)
		if err == nil && cfg == nil {
			t.Fatal("Parse returned neither a config nor an error")
		}
	})
}
