package outbound_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The exported surface of the library is listed in docs/DESIGN.md, by
// package, with why each name is exported: a name exported without being
// listed there fails this test.
func TestEveryExportedNameIsListedInTheDesign(t *testing.T) {
	doc, err := os.ReadFile("docs/DESIGN.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	start := strings.Index(text, "\n## Exported surface\n")
	if start < 0 {
		t.Fatal("docs/DESIGN.md has no section \"Exported surface\"")
	}
	text = text[start+1:]
	if end := strings.Index(text[3:], "\n## "); end >= 0 {
		text = text[:end+3]
	}
	// Each package's paragraph starts with its name in bold.
	heads := regexp.MustCompile("(?m)^\\*\\*`([a-z/]+)`\\*\\*").FindAllStringSubmatchIndex(text, -1)
	listed := map[string]map[string]bool{}
	tick := regexp.MustCompile("`([A-Za-z0-9_.]+)`")
	for i, h := range heads {
		end := len(text)
		if i+1 < len(heads) {
			end = heads[i+1][0]
		}
		names := map[string]bool{}
		for _, m := range tick.FindAllStringSubmatch(text[h[1]:end], -1) {
			for _, part := range strings.Split(m[1], ".") {
				names[part] = true
			}
		}
		listed[text[h[2]:h[3]]] = names
	}
	for _, dir := range []string{".", "admission", "admission/circuit", "admission/throttle", "admission/ratelimit",
		"admission/bulkhead", "attempt", "classify", "retry", "outcome", "criticality"} {
		pkg := "outbound"
		if dir != "." {
			pkg = dir
		}
		names, ok := listed[pkg]
		if !ok {
			t.Errorf("package %s has no paragraph in the section", pkg)
			continue
		}
		exported := exportedNames(t, dir)
		if len(exported) == 0 {
			t.Errorf("package %s: no exported name found", pkg)
		}
		for _, n := range exported {
			if !names[n] {
				t.Errorf("%s.%s is exported but not listed in docs/DESIGN.md's exported surface", filepath.Base(pkg), n)
			}
		}
	}
}

// exportedNames returns the exported top-level names of the package in dir,
// tests excluded.
func exportedNames(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range file.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil && d.Name.IsExported() {
					names = append(names, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					switch s := sp.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							names = append(names, s.Name.Name)
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								names = append(names, n.Name)
							}
						}
					}
				}
			}
		}
	}
	return names
}
