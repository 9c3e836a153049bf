package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseSettingRefusesWhatCannotReplaceAFlag(t *testing.T) {
	got, err := parseSetting(" --sandbox-claim-concurrent-workers=200  --disable-claim-events ")
	if err != nil || !slices.Equal(got, []string{"--sandbox-claim-concurrent-workers=200", "--disable-claim-events"}) {
		t.Fatalf("parseSetting = %q, %v", got, err)
	}
	if got, err := parseSetting(""); err != nil || len(got) != 0 {
		t.Fatalf("an empty setting is the args as found, got %q, %v", got, err)
	}
	for _, bad := range []string{"200", "-kube-api-qps=5", "--=5", "---x"} {
		_, err := parseSetting("--extensions " + bad)
		if err == nil || !strings.Contains(err.Error(), bad) || strings.Contains(err.Error(), "\n") {
			t.Errorf("parseSetting(%q): want a one-line error naming it, got %v", bad, err)
		}
	}
}

func TestPIDInCgroupFindsTheContainersFirstProcess(t *testing.T) {
	proc := t.TempDir()
	id := "24176d9bf0052ef028e8b0aae67a5fa12d5238d8147fd4e2959534b8d0a44196"
	for pid, cgroup := range map[string]string{
		"7":    "4:cpu,cpuacct:/kubepods/besteffort/pod1/other\n",
		"1200": "4:cpu,cpuacct:/kubepods/besteffort/podcd71/" + id + "\n",
		"950":  "4:cpu,cpuacct:/kubepods/besteffort/podcd71/" + id + "\n",
		"self": "4:cpu,cpuacct:/kubepods/besteffort/podcd71/" + id + "\n",
	} {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "cgroup"), []byte(cgroup), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := pidInCgroup(proc, id); err != nil || got != "950" {
		t.Fatalf("pidInCgroup = %q, %v; want 950", got, err)
	}
	if _, err := pidInCgroup(proc, "0123456789abcdef"); err == nil || !strings.Contains(err.Error(), "0123456789ab") {
		t.Fatalf("a container with no process here: want an error naming it, got %v", err)
	}
}
