package main

import (
	"debug/buildinfo"
	"debug/elf"
	"flag"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"
)

// weight is what one package (or module) adds to a binary.
type weight struct {
	name string
	text int64 // code
	data int64 // read-only and writable data with a symbol of its own (no bss)
}

// layout is a binary's sections, the part of them symbols account for and
// the weights by package.
type layout struct {
	file     int64
	sections []section
	text     int64 // sum of every package's code
	pclntab  int64 // the function table: names, line tables, stack maps
	packages map[string]*weight
	modules  []string // module paths from the build info, longest first
}

type section struct {
	name string
	size int64
}

func runReport(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	by := fs.String("by", "package", "package or module")
	top := fs.Int("top", 40, "rows shown")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 || (*by != "package" && *by != "module") {
		return usageError{fmt.Errorf("report [-by package|module] [-top N] BINARY (a build with symbols)")}
	}
	l, err := readLayout(fs.Arg(0))
	if err != nil {
		return err
	}
	l.print(stdout, *by, *top)
	return nil
}

func readLayout(path string) (*layout, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read ELF %s: %w", path, err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		return nil, fmt.Errorf("%s has no symbol table (report needs a build without -s): %w", path, err)
	}
	l := &layout{packages: map[string]*weight{}}
	if st, err := statSize(path); err == nil {
		l.file = st
	}
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_ALLOC == 0 || s.Type == elf.SHT_NOBITS || s.Size == 0 {
			continue
		}
		l.sections = append(l.sections, section{s.Name, int64(s.Size)})
		if s.Name == ".gopclntab" {
			l.pclntab = int64(s.Size)
		}
	}
	for _, s := range syms {
		if int(s.Section) <= 0 || int(s.Section) >= len(f.Sections) || s.Size == 0 {
			continue
		}
		sec := f.Sections[s.Section]
		if sec.Type == elf.SHT_NOBITS || sec.Name == ".gopclntab" {
			continue
		}
		pkg := packageOf(s.Name)
		w := l.packages[pkg]
		if w == nil {
			w = &weight{name: pkg}
			l.packages[pkg] = w
		}
		if sec.Flags&elf.SHF_EXECINSTR != 0 {
			w.text += int64(s.Size)
			l.text += int64(s.Size)
		} else {
			w.data += int64(s.Size)
		}
	}
	if bi, err := buildinfo.ReadFile(path); err == nil {
		for _, d := range bi.Deps {
			l.modules = append(l.modules, d.Path)
		}
		l.modules = append(l.modules, bi.Main.Path)
		slices.SortFunc(l.modules, func(a, b string) int { return len(b) - len(a) })
	}
	return l, nil
}

// packageOf names the package a Go symbol belongs to: the import path up to
// the first dot after its last slash, with the compiler's prefixes (type
// equality functions, itabs) and generic type arguments taken off. Symbols
// the linker makes (go:func.*, runtime tables) fall under their own names.
func packageOf(sym string) string {
	s := sym
	for _, p := range []string{"type:.eq.", "type:.hash.", "go:itab.*", "go:itab.", "type:*", "type:"} {
		if strings.HasPrefix(s, p) {
			s = s[len(p):]
			break
		}
	}
	s = strings.TrimPrefix(s, "*")
	if i := strings.IndexAny(s, "[(,"); i >= 0 {
		s = s[:i]
	}
	slash := strings.LastIndexByte(s, '/')
	if dot := strings.IndexByte(s[slash+1:], '.'); dot >= 0 {
		s = s[:slash+1+dot]
	}
	if u, err := url.PathUnescape(s); err == nil { // paho%2emqtt%2egolang
		s = u
	}
	switch {
	case strings.HasPrefix(s, "go:"):
		return sym
	case s == "" || s[0] == '.':
		return "(type data)"
	}
	return s
}

// moduleOf names the module holding pkg, "std" for the standard library
// and the runtime.
func (l *layout) moduleOf(pkg string) string {
	for _, m := range l.modules {
		if pkg == m || strings.HasPrefix(pkg, m+"/") {
			return m
		}
	}
	return "std"
}

func (l *layout) rows(by string) []weight {
	if by == "package" {
		rows := make([]weight, 0, len(l.packages))
		for _, w := range l.packages {
			rows = append(rows, *w)
		}
		return sortWeights(rows)
	}
	mods := map[string]*weight{}
	for _, w := range l.packages {
		m := l.moduleOf(w.name)
		if mods[m] == nil {
			mods[m] = &weight{name: m}
		}
		mods[m].text += w.text
		mods[m].data += w.data
	}
	rows := make([]weight, 0, len(mods))
	for _, w := range mods {
		rows = append(rows, *w)
	}
	return sortWeights(rows)
}

func sortWeights(rows []weight) []weight {
	slices.SortFunc(rows, func(a, b weight) int {
		if a.text+a.data != b.text+b.data {
			return int((b.text + b.data) - (a.text + a.data))
		}
		return strings.Compare(a.name, b.name)
	})
	return rows
}

func (l *layout) print(w io.Writer, by string, top int) {
	fmt.Fprintf(w, "file %s; code %s in symbols, function table (.gopclntab) %s\n", mib(l.file), mib(l.text), mib(l.pclntab))
	fmt.Fprintln(w, "sections (allocated, as a stripped binary keeps them):")
	for _, s := range l.sections {
		fmt.Fprintf(w, "  %-14s %10d  %s\n", s.name, s.size, mib(s.size))
	}
	// The function table grows with the code: each function's name, line
	// and stack tables. Shared out in proportion to code, it estimates what
	// a package costs a stripped binary.
	ratio := 0.0
	if l.text > 0 {
		ratio = float64(l.pclntab) / float64(l.text)
	}
	rows := l.rows(by)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "\ncode\tdata\t~stripped\t%s\t\n", by)
	var shownText, shownData int64
	for i, r := range rows {
		if i == top {
			break
		}
		shownText += r.text
		shownData += r.data
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t\n", r.text, r.data, mib(int64(float64(r.text)*(1+ratio))+r.data), r.name)
	}
	var allText, allData int64
	for _, r := range rows {
		allText += r.text
		allData += r.data
	}
	fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t\n", allText-shownText, allData-shownData,
		mib(int64(float64(allText-shownText)*(1+ratio))+allData-shownData), fmt.Sprintf("the other %d", max(0, len(rows)-top)))
	tw.Flush()
	fmt.Fprintf(w, "(~stripped: code × %.2f for its share of the function table, plus data; type descriptors and strings the linker merges are not in any row)\n", 1+ratio)
}

func mib(n int64) string { return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20)) }
