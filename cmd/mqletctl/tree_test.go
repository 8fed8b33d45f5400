package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryCommandHelpCompletionAndExitCodes walks the command tree: every
// command has help (help NAME and NAME --help, the same text, a usage line
// and an example, exit 0), an unknown flag exits 2 naming it and where to
// read more, its usage without arguments exits as the table says (2 for a
// usage error, 1 for a command that ran and could not reach the broker),
// and bash completion offers its name and each of its own flags.
func TestEveryCommandHelpCompletionAndExitCodes(t *testing.T) {
	// What each command does with no arguments, against a broker nobody
	// listens on.
	bare := map[string]int{
		"apply": exitUsage, "delete": exitUsage, "sync": exitUsage, "get": exitUsage, "describe": exitUsage,
		"top": exitUsage, "status": exitFail, "watch": exitFail, "sign": exitUsage, "keys": exitUsage,
		"certs": exitUsage, "logs": exitUsage, "exec": exitUsage, "restart": exitUsage, "config": exitUsage,
		"group": exitUsage, "rollout": exitUsage, "completion": exitUsage, "version": exitOK,
	}
	script := filepath.Join(t.TempDir(), "c.bash")
	comp := runCLIEnv(t, map[string]string{}, "", "completion", "bash")
	if comp.code != 0 {
		t.Fatalf("completion bash: %v", comp)
	}
	if err := os.WriteFile(script, []byte(comp.stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	complete := func(words ...string) []string {
		t.Helper()
		prog := `source "$1"; COMP_WORDS=(` + strings.Join(words, " ") + `); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); _mqletctl; printf '%s\n' "${COMPREPLY[@]}"`
		out, err := exec.Command("bash", "-c", prog, "bash", script).CombinedOutput()
		if err != nil {
			t.Fatalf("completing %v: %v\n%s", words, err, out)
		}
		return strings.Fields(string(out))
	}
	env := map[string]string{envBroker: "tcp://127.0.0.1:1", envNode: "n1"}
	seen := map[string]bool{}
	for _, c := range commands() {
		t.Run(c.name, func(t *testing.T) {
			seen[c.name] = true
			help := runCLIEnv(t, env, "", "help", c.name)
			if help.code != exitOK || !strings.Contains(help.stdout, "Usage:\n  mqletctl "+c.name) || !strings.Contains(help.stdout, c.summary) {
				t.Errorf("help %s: want exit 0 with its summary and a usage line\n%v", c.name, help)
			}
			if c.name != "version" && c.name != "status" && !strings.Contains(help.stdout, "Example:\n  mqletctl ") {
				t.Errorf("help %s: no example\n%s", c.name, help.stdout)
			}
			if dash := runCLIEnv(t, env, "", c.name, "--help"); dash.code != exitOK || dash.stdout != help.stdout {
				t.Errorf("%s --help differs from help %s:\n%v\n%v", c.name, c.name, dash, help)
			}
			bad := runCLIEnv(t, env, "", c.name, "--no-such-flag")
			// A command with subcommands names the word where a subcommand
			// belongs; the others say it is an unknown flag.
			if bad.code != exitUsage || !strings.Contains(bad.stderr, "--no-such-flag") || !strings.Contains(bad.stderr, "See 'mqletctl help "+c.name+"'") {
				t.Errorf("%s --no-such-flag: want exit 2 naming the flag\n%v", c.name, bad)
			}
			want, ok := bare[c.name]
			if !ok {
				t.Fatalf("command %s is missing from the table of exit codes", c.name)
			}
			if got := runCLIEnv(t, env, "", c.name, "--timeout", "2s"); got.code != want {
				t.Errorf("%s with no arguments: exit %d, want %d\n%v", c.name, got.code, want, got)
			}
			if got := complete("mqletctl", c.name[:len(c.name)-1]); !contains(got, c.name) {
				t.Errorf("mqletctl %s<TAB> offers %v, not %s", c.name[:len(c.name)-1], got, c.name)
			}
			for _, f := range commandFlags(c) {
				if !strings.Contains(help.stdout, f) {
					t.Errorf("help %s does not name its flag %s", c.name, f)
				}
				if got := complete("mqletctl", c.name, f); !contains(got, f) {
					t.Errorf("mqletctl %s %s<TAB> offers %v", c.name, f, got)
				}
			}
		})
	}
	for name := range bare {
		if !seen[name] {
			t.Errorf("the table names %s, which is no command", name)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
