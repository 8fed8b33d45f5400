package manifest

import (
	"fmt"
	"strconv"

	yaml2 "go.yaml.in/yaml/v2"
)

// yamlDuplicateFields reports every key that appears twice in one mapping of
// a YAML document, by field path. Converting YAML to JSON keeps only the last
// of duplicated keys, so they must be found on the YAML itself.
// A document that does not parse yields nothing here; the converter reports it.
func yamlDuplicateFields(raw []byte) []error {
	var doc yaml2.MapSlice
	if err := yaml2.Unmarshal(raw, &doc); err != nil {
		return nil
	}
	var errs []error
	walkDuplicates(doc, "", &errs)
	return errs
}

func walkDuplicates(node any, path string, errs *[]error) {
	switch n := node.(type) {
	case yaml2.MapSlice:
		seen := make(map[string]bool, len(n))
		for _, item := range n {
			key := fmt.Sprint(item.Key)
			child := key
			if path != "" {
				child = path + "." + key
			}
			if seen[key] {
				*errs = append(*errs, fmt.Errorf("duplicate field %q", child))
				continue
			}
			seen[key] = true
			walkDuplicates(item.Value, child, errs)
		}
	case []any:
		for i, v := range n {
			walkDuplicates(v, path+"["+strconv.Itoa(i)+"]", errs)
		}
	}
}
