package outbound_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// docsWithGo are the Markdown files whose Go snippets are checked: the
// README and every page of the documentation.
func docsWithGo(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	more, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]string{}
	for _, p := range append(paths, more...) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		docs[p] = string(b)
	}
	if docs["README.md"] == "" {
		t.Fatal("no README.md")
	}
	return docs
}

// Every Go snippet of the README and the documentation is compiled and
// run: its lines appear, in order and one after the other, in the body of
// an Example function of the repository, which the test suite compiles
// and whose output it checks. A snippet that drifts from the code it shows
// fails here.
func TestEveryGoSnippetOfTheDocsIsInAnExample(t *testing.T) {
	docs := docsWithGo(t)
	var bodies [][]string // the lines of every Example's body, trimmed
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || !strings.HasPrefix(fn.Name.Name, "Example") || fn.Body == nil {
				continue
			}
			body := string(src[fset.Position(fn.Body.Lbrace).Offset+1 : fset.Position(fn.Body.Rbrace).Offset])
			bodies = append(bodies, lines(body))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(goBlocks(docs["README.md"])); n < 5 {
		t.Fatalf("only %d Go snippets found in the README", n)
	}
	for path, md := range docs {
		for _, sn := range goBlocks(md) {
			want := lines(sn.text)
			found := false
			for _, b := range bodies {
				if contains(b, want) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s:%d: this snippet is in no Example function:\n%s", path, sn.line, sn.text)
			}
		}
	}
}

// TestEveryGoSnippetOfTheDocsParses: a snippet read on its own is
// whole Go — statements, or declarations — not a fragment cut mid-block
// (an Example may hold it among others).
func TestEveryGoSnippetOfTheDocsParses(t *testing.T) {
	for path, md := range docsWithGo(t) {
		for _, sn := range goBlocks(md) {
			fset := token.NewFileSet()
			_, errStmts := parser.ParseFile(fset, "snippet.go", "package p\nfunc _() {\n"+sn.text+"\n}\n", 0)
			_, errDecls := parser.ParseFile(fset, "snippet.go", "package p\n"+sn.text, 0)
			if errStmts != nil && errDecls != nil {
				t.Errorf("%s:%d: this snippet is not whole Go: %v\n%s", path, sn.line, errStmts, sn.text)
			}
		}
	}
}

type snippet struct {
	line int
	text string
}

// goBlocks returns the ```go blocks of a Markdown text.
func goBlocks(md string) []snippet {
	var out []snippet
	var cur *strings.Builder
	start := 0
	for i, l := range strings.Split(md, "\n") {
		switch {
		case cur == nil && strings.TrimSpace(l) == "```go":
			cur, start = new(strings.Builder), i+2
		case cur != nil && strings.TrimSpace(l) == "```":
			out = append(out, snippet{line: start, text: cur.String()})
			cur = nil
		case cur != nil:
			cur.WriteString(l + "\n")
		}
	}
	return out
}

// lines returns the non-empty lines of s, trimmed, with runs of spaces
// (gofmt's alignment of comments) made one.
func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.Join(strings.Fields(l), " "); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// contains reports whether want appears in have, line after line.
func contains(have, want []string) bool {
	for i := 0; i+len(want) <= len(have); i++ {
		match := true
		for j := range want {
			if have[i+j] != want[j] {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}
