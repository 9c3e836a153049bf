// Package quickstart reads the quickstarts out of the docs, so that tests run exactly what a
// user copies. A fenced block is part of a quickstart when the line above it is an HTML comment
// `<!-- quickstart: NAME -->` (a shell block: its commands, in order) or
// `<!-- quickstart: NAME FILE -->` (the block is the file FILE the commands use). Everything a
// reader replaces (the token, the registry, the instance) is a documented placeholder that the
// tests substitute, and nothing else.
package quickstart

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// Docs are the files with quickstarts, relative to the module root.
var Docs = []string{"README.md", "docs/install.md"}

// The quickstarts of Docs: the README's (the chart with the runner in the cluster), install.md's
// chart install with the runner in the cluster, its install of GitLab's default flow images with
// a site values file, and its runner on a VM.
const (
	README  = "readme"
	Chart   = "chart"
	DuoFlow = "duo-flow"
	VM      = "vm"
)

// Names are all the quickstarts Docs must have.
var Names = []string{README, Chart, DuoFlow, VM}

// Block is one marked fenced block.
type Block struct {
	// Names are the quickstarts the block is part of; File, for a file block, the file's name.
	Names []string
	File  string
	// Source is where the block is: path:line of its marker.
	Source string
	// Text is the block's content, without its fences.
	Text string
}

// Quickstart is the blocks of one name, in the order of the files given to Read and of the lines.
type Quickstart struct {
	Name string
	// Files are the file blocks by name; Commands the shell commands of the shell blocks, each
	// one command line (continuations joined, comments and blank lines dropped).
	Files    map[string]string
	Commands []string
	Sources  []string
}

var marker = regexp.MustCompile(`^<!--\s*quickstart:\s*([a-z0-9-]+(?:\s*,\s*[a-z0-9-]+)*)(?:\s+file=(\S+))?\s*-->$`)

// Blocks reads the marked blocks of each file (relative to root). A marker that no fenced
// block follows, or a block that does not end, is an error naming the line.
func Blocks(root string, files ...string) ([]Block, error) {
	var blocks []Block
	for _, name := range files {
		data, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			return nil, err
		}
		lines := strings.Split(string(data), "\n")
		for i := 0; i < len(lines); i++ {
			m := marker.FindStringSubmatch(strings.TrimSpace(lines[i]))
			if m == nil {
				continue
			}
			source := fmt.Sprintf("%s:%d", name, i+1)
			if i+1 >= len(lines) || !strings.HasPrefix(strings.TrimSpace(lines[i+1]), "```") {
				return nil, fmt.Errorf("%s: the quickstart marker is not right above a fenced block", source)
			}
			indent := lines[i+1][:len(lines[i+1])-len(strings.TrimLeft(lines[i+1], " "))]
			end := slices.IndexFunc(lines[i+2:], func(l string) bool { return strings.TrimSpace(l) == "```" })
			if end < 0 {
				return nil, fmt.Errorf("%s: the quickstart's fenced block does not end", source)
			}
			body := lines[i+2 : i+2+end]
			for j := range body {
				body[j] = strings.TrimPrefix(body[j], indent)
			}
			names := strings.Split(m[1], ",")
			for j := range names {
				names[j] = strings.TrimSpace(names[j])
			}
			blocks = append(blocks, Block{Names: names, File: m[2], Source: source, Text: strings.Join(body, "\n") + "\n"})
			i += 2 + end
		}
	}
	return blocks, nil
}

// Read collects the quickstarts of the files (relative to root) by name.
func Read(root string, files ...string) (map[string]*Quickstart, error) {
	blocks, err := Blocks(root, files...)
	if err != nil {
		return nil, err
	}
	quickstarts := map[string]*Quickstart{}
	for _, b := range blocks {
		for _, name := range b.Names {
			q := quickstarts[name]
			if q == nil {
				q = &Quickstart{Name: name, Files: map[string]string{}}
				quickstarts[name] = q
			}
			q.Sources = append(q.Sources, b.Source)
			if b.File == "" {
				q.Commands = append(q.Commands, Commands(b.Text)...)
				continue
			}
			if _, dup := q.Files[b.File]; dup {
				return nil, fmt.Errorf("%s: quickstart %s has file %s twice", b.Source, name, b.File)
			}
			q.Files[b.File] = b.Text
		}
	}
	return quickstarts, nil
}

// Commands splits a shell block into its command lines: a line ending in a backslash goes on
// in the next, and blank lines and comments are dropped.
func Commands(text string) []string {
	var commands []string
	var current strings.Builder
	scanner := bufio.NewScanner(strings.NewReader(text))
	for scanner.Scan() {
		line := strings.TrimSpace(scanner.Text())
		if current.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if more, ok := strings.CutSuffix(line, `\`); ok {
			current.WriteString(strings.TrimSpace(more) + " ")
			continue
		}
		current.WriteString(line)
		commands = append(commands, stripComment(current.String()))
		current.Reset()
	}
	if current.Len() > 0 {
		commands = append(commands, strings.TrimSpace(current.String()))
	}
	return commands
}

// stripComment drops a trailing ` # comment` outside quotes.
func stripComment(command string) string {
	var quote rune
	for i, r := range command {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && i > 0 && command[i-1] == ' ':
			return strings.TrimSpace(command[:i])
		}
	}
	return command
}

// Placeholders map what the docs tell a reader to replace to the values of a test run.
type Placeholders map[string]string

// Apply replaces every placeholder in text where it stands as a whole word (a namespace
// `ci-sandbox` is not the end of `my-ci-sandbox`), longest first, so one placeholder that
// contains another is replaced whole.
func (p Placeholders) Apply(text string) string {
	keys := make([]string, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return len(b) - len(a) })
	var out strings.Builder
	for i := 0; i < len(text); {
		if i == 0 || !isWordByte(text[i-1]) {
			if k, ok := matchAt(text, i, keys); ok {
				out.WriteString(p[k])
				i += len(k)
				continue
			}
		}
		out.WriteByte(text[i])
		i++
	}
	return out.String()
}

func matchAt(text string, i int, keys []string) (string, bool) {
	for _, k := range keys {
		end := i + len(k)
		if strings.HasPrefix(text[i:], k) && (end == len(text) || !isWordByte(text[end]) || !isWordByte(k[len(k)-1])) {
			return k, true
		}
	}
	return "", false
}

func isWordByte(b byte) bool {
	return b == '_' || b == '-' || b == '.' || '0' <= b && b <= '9' || 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z'
}

// Args splits a command line into its words as sh does for the quickstarts' commands: single
// and double quotes group (no expansions inside them), a backslash outside quotes escapes the
// next character. A command that needs more of the shell is refused.
func Args(command string) ([]string, error) {
	var args []string
	var word strings.Builder
	inWord, escaped := false, false
	var quote rune
	for _, r := range command {
		switch {
		case escaped:
			word.WriteRune(r)
			escaped = false
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				word.WriteRune(r)
			}
		case r == '\\':
			escaped, inWord = true, true
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				args = append(args, word.String())
				word.Reset()
				inWord = false
			}
		case strings.ContainsRune("|&;<>()$`", r):
			return nil, fmt.Errorf("%q: %q needs a shell; the quickstarts' commands are plain", command, r)
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 || escaped {
		return nil, fmt.Errorf("%q: an unterminated quote or escape", command)
	}
	if inWord {
		args = append(args, word.String())
	}
	return args, nil
}

// WriteFiles writes the quickstart's files into dir with the placeholders replaced.
func (q *Quickstart) WriteFiles(dir string, p Placeholders) error {
	for name, text := range q.Files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(p.Apply(text)), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// Argv is each of the quickstart's commands with the placeholders replaced, split into words.
func (q *Quickstart) Argv(p Placeholders) ([][]string, error) {
	argv := make([][]string, 0, len(q.Commands))
	for _, command := range q.Commands {
		args, err := Args(p.Apply(command))
		if err != nil {
			return nil, fmt.Errorf("quickstart %s: %w", q.Name, err)
		}
		argv = append(argv, args)
	}
	return argv, nil
}
