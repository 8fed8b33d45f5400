package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The bash script completes commands, kinds and each command's own flags,
// and bash itself completes with it.
func TestCompletionBash(t *testing.T) {
	res := runCLIEnv(t, map[string]string{}, "", "completion", "bash")
	if res.code != 0 || !strings.Contains(res.stdout, "complete -F _mqletctl mqletctl") {
		t.Fatalf("completion bash: %v", res)
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("bash is needed to check the script: %v", err)
	}
	script := filepath.Join(t.TempDir(), "c.bash")
	if err := os.WriteFile(script, []byte(res.stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	complete := func(words ...string) string {
		t.Helper()
		line := strings.Join(words, " ")
		prog := `source "$1"; COMP_WORDS=(` + line + `); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); _mqletctl; echo "${COMPREPLY[*]}"`
		out, err := exec.Command(bash, "-c", prog, "bash", script).CombinedOutput()
		if err != nil {
			t.Fatalf("running the completion for %q: %v\n%s", line, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if got := complete("mqletctl", "des"); got != "describe" {
		t.Errorf("mqletctl des<TAB> = %q", got)
	}
	if got := complete("mqletctl", "get", "no"); got != "nodes" {
		t.Errorf("mqletctl get no<TAB> = %q", got)
	}
	if got := complete("mqletctl", "get", "ev"); got != "events" {
		t.Errorf("mqletctl get ev<TAB> = %q", got)
	}
	if got := complete("mqletctl", "get", "--fo"); got != "--for" {
		t.Errorf("mqletctl get --fo<TAB> = %q", got)
	}
	if got := complete("mqletctl", "delete", "--grace"); got != "--grace-period" {
		t.Errorf("mqletctl delete --grace<TAB> = %q", got)
	}
	if got := complete("mqletctl", "get", "--cont"); got != "--context" {
		t.Errorf("mqletctl get --cont<TAB> = %q (global flags)", got)
	}
	// A pod name comes after logs, not a kind; a value after -n; one-letter
	// flags are offered as typed; a global flag's value is not the command.
	if got := complete("mqletctl", "logs", "''"); got != "" {
		t.Errorf("mqletctl logs <TAB> = %q, want nothing (a pod name)", got)
	}
	if got := complete("mqletctl", "get", "pods", "-n", "''"); got != "" {
		t.Errorf("mqletctl get pods -n <TAB> = %q, want nothing (a namespace)", got)
	}
	if got := complete("mqletctl", "logs", "web", "-"); !strings.Contains(" "+got+" ", " -c ") || strings.Contains(got, "--c ") || strings.Contains(got, "--f ") {
		t.Errorf("mqletctl logs web -<TAB> = %q, want -c and -f as typed", got)
	}
	if got := complete("mqletctl", "--node", "gw1", "get", "no"); got != "nodes" {
		t.Errorf("mqletctl --node gw1 get no<TAB> = %q", got)
	}
	if got := complete("mqletctl", "restart", "''"); got != "pod" {
		t.Errorf("mqletctl restart <TAB> = %q", got)
	}
	res = runCLIEnv(t, map[string]string{}, "", "completion", "zsh")
	if res.code != 0 || !strings.HasPrefix(res.stdout, "autoload -U +X bashcompinit") {
		t.Errorf("completion zsh: %v", res)
	}
	res = runCLIEnv(t, map[string]string{}, "", "completion", "fish")
	if res.code != 2 {
		t.Errorf("completion fish: %v", res)
	}
}
