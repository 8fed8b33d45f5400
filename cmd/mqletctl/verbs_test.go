package main

import (
	"os"
	"strings"
	"testing"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// A verb added to the contract (apiv1.Verbs, which the agent's verb table
// and the signing rules are derived from) is not done until the operator
// can find it: a row of its own in the command table of docs/design.md, a
// place in docs/security.md's table of who may do what, and an mqletctl
// command with help and an example (cancel has none: mqletctl sends it on
// Ctrl-C of logs -f, exec and restart, which say so).
func TestEveryVerbHasItsDocRowHelpAndSigningRule(t *testing.T) {
	design := readDoc(t, "../../docs/design.md")
	security := readDoc(t, "../../docs/security.md")
	var whoMayDoWhat string
	for _, l := range strings.Split(security, "\n") {
		if strings.HasPrefix(l, "| who ") {
			whoMayDoWhat = l
		}
	}
	if whoMayDoWhat == "" {
		t.Fatal("docs/security.md has no table of who may do what (a header row starting \"| who \")")
	}
	for _, verb := range apiv1.Verbs() {
		if !strings.Contains(design, "\n| `"+verb+"` |") {
			t.Errorf("verb %s has no row in docs/design.md's command table", verb)
		}
		if !strings.Contains(whoMayDoWhat, verb) {
			t.Errorf("verb %s is not in docs/security.md's table of who may do what", verb)
		}
		if verb == apiv1.VerbCancel {
			continue
		}
		res := runCLIEnv(t, map[string]string{}, "", "help", verb)
		if res.code != 0 || !strings.Contains(res.stdout, "Usage:") || !strings.Contains(res.stdout, "Example") {
			t.Errorf("mqletctl help %s has no usage and example: %v", verb, res)
		}
	}
	// The signing rule: a key generated for an operator may sign every
	// verb (keys generate prints apiv1.Verbs(); config accepts each).
	res := runCLIEnv(t, map[string]string{}, "", "keys", "generate", "--out", t.TempDir()+"/op.key")
	for _, verb := range apiv1.Verbs() {
		if !strings.Contains(res.stdout, verb) {
			t.Errorf("keys generate prints a trusted-key entry that cannot sign %s: %v", verb, res)
		}
	}
}

func readDoc(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
