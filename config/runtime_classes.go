package config

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// RuntimeClass is one node.k8s.io/v1 RuntimeClass, kept in the file
// rather than applied over MQTT: its handler must exist in the runtime's
// own configuration on the gateway, which the installer writes, and a
// broker login must not repoint a class of untrusted pods at a weaker
// handler. Fields follow the API object: metadata.name, handler,
// overhead.podFixed, scheduling.nodeSelector.
type RuntimeClass struct {
	Name    string `json:"name"`
	Handler string `json:"handler"`
	// Overhead is overhead.podFixed: resource name → quantity ("cpu":
	// "100m", "memory": "20Mi").
	Overhead map[string]string `json:"overhead"`
	// NodeSelector is scheduling.nodeSelector.
	NodeSelector map[string]string `json:"nodeSelector"`
}

// maxRuntimeClasses bounds runtime.classes.
const maxRuntimeClasses = 64

func validateRuntimeClasses(classes []RuntimeClass, bad func(field, format string, args ...any)) {
	if len(classes) > maxRuntimeClasses {
		bad("runtime.classes", "%d classes, at most %d", len(classes), maxRuntimeClasses)
		return
	}
	seen := map[string]int{}
	for i, c := range classes {
		at := fmt.Sprintf("runtime.classes[%d]", i)
		for _, msg := range validation.IsDNS1123Subdomain(c.Name) {
			bad(at+".name", "%q: %s", c.Name, msg)
		}
		if j, dup := seen[c.Name]; dup {
			bad(at+".name", "%q repeats runtime.classes[%d]", c.Name, j)
		}
		seen[c.Name] = i
		// The API server's rule for a handler: a DNS label.
		for _, msg := range validation.IsDNS1123Label(c.Handler) {
			bad(at+".handler", "%q: %s", c.Handler, msg)
		}
		for name, q := range c.Overhead {
			if name != "cpu" && name != "memory" {
				bad(at+".overhead."+name, "only cpu and memory overheads are accounted")
				continue
			}
			v, err := resource.ParseQuantity(q)
			if err != nil {
				bad(at+".overhead."+name, "%q is not a quantity: %v", q, err)
			} else if v.Sign() < 0 {
				bad(at+".overhead."+name, "must not be negative")
			}
		}
		for _, e := range metav1validation.ValidateLabels(c.NodeSelector, field.NewPath(at, "nodeSelector")) {
			bad(e.Field, "%s", e.ErrorBody())
		}
	}
}

// RuntimeClassOverhead parses a validated class's overhead.
func RuntimeClassOverhead(c RuntimeClass) map[string]resource.Quantity {
	out := make(map[string]resource.Quantity, len(c.Overhead))
	for name, q := range c.Overhead {
		if v, err := resource.ParseQuantity(q); err == nil {
			out[name] = v
		}
	}
	return out
}
