package testutil

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// ModulePath identifies this repository's go.mod when looking for the module root.
const ModulePath = "github.com/sandbox-executor/sandbox-executor"

// ModuleRoot finds this repository's root: the first directory up from the working directory
// (go test runs in the package's directory, go run where make runs) whose go.mod declares this
// module, else the one this source file was compiled from.
func ModuleRoot() (string, error) {
	if dir, err := os.Getwd(); err == nil {
		for ; ; dir = filepath.Dir(dir) {
			if isModuleRoot(dir) {
				return dir, nil
			}
			if filepath.Dir(dir) == dir {
				break
			}
		}
	}
	if _, thisFile, _, ok := runtime.Caller(0); ok {
		dir := filepath.Join(filepath.Dir(thisFile), "..", "..")
		if isModuleRoot(dir) {
			return filepath.Clean(dir), nil
		}
	}
	return "", fmt.Errorf("no go.mod of %s above the working directory", ModulePath)
}

func isModuleRoot(dir string) bool {
	f, err := os.Open(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	defer f.Close()
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		if fields := strings.Fields(scanner.Text()); len(fields) == 2 && fields[0] == "module" {
			return fields[1] == ModulePath
		}
	}
	return false
}
