package apiv1

import (
	"strings"
	"testing"
)

func TestDecodeShellMessages(t *testing.T) {
	if in, err := DecodeShellInput([]byte(`{"seq":1,"data":"aGk=","resize":{"cols":80,"rows":24},"ack":3}`)); err != nil || string(in.Data) != "hi" || in.Resize.Cols != 80 || in.Ack != 3 {
		t.Fatalf("DecodeShellInput = %+v, %v", in, err)
	}
	if out, err := DecodeShellOutput([]byte(`{"seq":2,"exit":3,"ack":1}`)); err != nil || out.Exit == nil || *out.Exit != 3 {
		t.Fatalf("DecodeShellOutput = %+v, %v", out, err)
	}
	big := `{"seq":1,"data":"` + strings.Repeat("A", ShellMaxMessageBytes) + `"}`
	for _, bad := range []string{
		`{"seq":1,"data":"aGk=","extra":1}`, // unknown field
		`{"data":"aGk="}`,                   // data without a number
		`{"seq":1}`,                         // a number without data
		`{"seq":1,"resize":{"cols":0,"rows":24}}`,
		`{"seq":1,"resize":{"cols":80,"rows":5000}}`,
		`{"seq":1,"resize":{"cols":80,"rows":70000}}`, // overflows uint16
		`{"seq":-1,"data":"aGk="}`,
		`{"ack":1} {"ack":2}`,
		`not json`,
		big,
	} {
		if in, err := DecodeShellInput([]byte(bad)); err == nil {
			t.Errorf("DecodeShellInput(%.60q) = %+v, want an error", bad, in)
		}
	}
	for _, bad := range []string{`{"exit":3}`, `{"data":"aGk="}`, `{"seq":1,"ack":"x"}`} {
		if out, err := DecodeShellOutput([]byte(bad)); err == nil {
			t.Errorf("DecodeShellOutput(%q) = %+v, want an error", bad, out)
		}
	}
}
