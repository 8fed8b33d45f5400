package main

import (
	"bufio"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
)

// defaultRecord is the file a deliberate change of a binary's size updates.
const defaultRecord = "test/size/sizes.txt"

// binary is a built program as the record names it: the command and the
// platform it was built for, read from the binary's own build info.
type binary struct {
	file     string
	program  string // mqlet, mqletctl
	platform string // linux/amd64, linux/arm64, linux/arm/v7
	size     int64
}

func readBinary(file string) (binary, error) {
	b := binary{file: file}
	bi, err := buildinfo.ReadFile(file)
	if err != nil {
		return b, fmt.Errorf("read build info of %s: %w", file, err)
	}
	b.program = path.Base(bi.Path)
	var goos, goarch, goarm string
	for _, s := range bi.Settings {
		switch s.Key {
		case "GOOS":
			goos = s.Value
		case "GOARCH":
			goarch = s.Value
		case "GOARM":
			goarm = s.Value
		}
	}
	b.platform = goos + "/" + goarch
	if goarch == "arm" && goarm != "" {
		b.platform += "/v" + strings.TrimSuffix(goarm, ",softfloat")
	}
	f, err := elf.Open(file)
	if err != nil {
		return b, fmt.Errorf("read ELF %s: %w", file, err)
	}
	defer f.Close()
	if f.Section(".symtab") != nil {
		return b, fmt.Errorf("%s has a symbol table: the record holds stripped sizes (build with -ldflags '-s -w', as make build does)", file)
	}
	st, err := os.Stat(file)
	if err != nil {
		return b, err
	}
	b.size = st.Size()
	return b, nil
}

func (b binary) key() string { return b.program + " " + b.platform }

func statSize(file string) (int64, error) {
	st, err := os.Stat(file)
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// readRecord reads "program platform bytes" lines; # starts a comment.
func readRecord(file string) (map[string]int64, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("open the size record: %w", err)
	}
	defer f.Close()
	rec := map[string]int64{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 3 {
			return nil, fmt.Errorf("%s:%d: want \"program platform bytes\", got %q", file, n, sc.Text())
		}
		size, err := strconv.ParseInt(fields[2], 10, 64)
		if err != nil || size <= 0 {
			return nil, fmt.Errorf("%s:%d: bytes %q is not a positive number", file, n, fields[2])
		}
		rec[fields[0]+" "+fields[1]] = size
	}
	return rec, sc.Err()
}

func runCheck(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	record := fs.String("record", defaultRecord, "the recorded sizes")
	maxGrowth := fs.Float64("max-growth", 5, "percent a binary may grow past its record")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return usageError{fmt.Errorf("check [-record FILE] [-max-growth PCT] BINARY...")}
	}
	rec, err := readRecord(*record)
	if err != nil {
		return err
	}
	var failed []string
	for _, file := range fs.Args() {
		b, err := readBinary(file)
		if err != nil {
			return err
		}
		want, ok := rec[b.key()]
		if !ok {
			failed = append(failed, fmt.Sprintf("%s (%s): no record for %q in %s", file, mib(b.size), b.key(), *record))
			continue
		}
		growth := 100 * float64(b.size-want) / float64(want)
		fmt.Fprintf(stdout, "size: %s %s: %d bytes (%s), record %d (%s), %+.2f %%\n", b.program, b.platform, b.size, mib(b.size), want, mib(want), growth)
		if growth > *maxGrowth {
			failed = append(failed, fmt.Sprintf("%s %s grew %.1f %% past its record (%d → %d bytes, limit +%g %%)", b.program, b.platform, growth, want, b.size, *maxGrowth))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%s\n(see what grew: go run ./test/size report on an unstripped build; a deliberate growth updates %s with make size-record)", strings.Join(failed, "\n"), *record)
	}
	return nil
}

func runRecord(args []string, stdout, stderr io.Writer) error {
	flags := flag.NewFlagSet("record", flag.ContinueOnError)
	flags.SetOutput(stderr)
	record := flags.String("record", defaultRecord, "the recorded sizes, rewritten")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if flags.NArg() == 0 {
		return usageError{fmt.Errorf("record [-record FILE] BINARY...")}
	}
	rec, err := readRecord(*record)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if rec == nil {
		rec = map[string]int64{}
	}
	for _, file := range flags.Args() {
		b, err := readBinary(file)
		if err != nil {
			return err
		}
		rec[b.key()] = b.size
		fmt.Fprintf(stdout, "size: recorded %s %s: %d bytes (%s)\n", b.program, b.platform, b.size, mib(b.size))
	}
	keys := make([]string, 0, len(rec))
	for k := range rec {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var out strings.Builder
	out.WriteString(recordHeader)
	for _, k := range keys {
		program, platform, _ := strings.Cut(k, " ")
		fmt.Fprintf(&out, "%-9s %-13s %d\n", program, platform, rec[k])
	}
	return os.WriteFile(*record, []byte(out.String()), 0o644)
}

const recordHeader = `# Stripped sizes in bytes of the binaries make build and make release
# ship (-trimpath, -ldflags '-s -w', -tags grpcnotrace). test/run-tests.sh
# fails when one grows more than 5 % past its line (go run ./test/size
# check). A deliberate growth rewrites this file: make size-record.
# program platform bytes
`
