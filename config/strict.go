package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// decodeStrict decodes a YAML document into v. Unlike yaml.UnmarshalStrict
// (which hands the JSON to encoding/json), keys are matched exactly, as the
// sample file spells them, and every problem names its YAML path:
// "mqtt.brokr: unknown field", "mqtt.keepAlive: invalid duration".
func decodeStrict(data []byte, v any) error {
	j, err := yaml.YAMLToJSONStrict(data) // rejects duplicate keys
	if err != nil {
		return err
	}
	var doc any
	if err := json.Unmarshal(j, &doc); err != nil {
		return err
	}
	var errs []error
	checkKeys(doc, reflect.TypeOf(v).Elem(), "", &errs)
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// The decoding itself is sigs.k8s.io/yaml's, which reads a value by the
	// type of its field (node: n is the string "n", not YAML 1.1's false).
	if err := yaml.UnmarshalStrict(data, v); err != nil {
		// Its message has no path; the typeless JSON usually fails the same
		// way and says where.
		var te *json.UnmarshalTypeError
		probe := reflect.New(reflect.TypeOf(v).Elem()).Interface()
		if jerr := json.Unmarshal(j, probe); errors.As(jerr, &te) && te.Field != "" {
			return &FieldError{Field: te.Field, Reason: fmt.Sprintf("want %s, got %s", te.Type, te.Value)}
		}
		return err
	}
	return nil
}

var unmarshalerType = reflect.TypeOf((*json.Unmarshaler)(nil)).Elem()

// checkKeys walks doc along t and reports every key t has no exact field
// for, and every value a custom decoder refuses, with its path.
func checkKeys(doc any, t reflect.Type, path string, errs *[]error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		b, _ := json.Marshal(doc) // came from JSON, encodes again
		if err := json.Unmarshal(b, reflect.New(t).Interface()); err != nil {
			*errs = append(*errs, &FieldError{Field: path, Reason: err.Error()})
		}
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := doc.(map[string]any)
		if !ok {
			return // a type mismatch; the decoder names it
		}
		fields := jsonFields(t)
		for key, val := range obj {
			sub := join(path, key)
			ft, ok := fields[key]
			if !ok {
				reason := "unknown field"
				for name := range fields {
					if strings.EqualFold(name, key) {
						reason = fmt.Sprintf("unknown field (did you mean %q? keys are case-sensitive)", name)
					}
				}
				*errs = append(*errs, &FieldError{Field: sub, Reason: reason})
				continue
			}
			checkKeys(val, ft, sub, errs)
		}
	case reflect.Slice, reflect.Array:
		if list, ok := doc.([]any); ok {
			for i, val := range list {
				checkKeys(val, t.Elem(), path+"["+strconv.Itoa(i)+"]", errs)
			}
		}
	case reflect.Map:
		if obj, ok := doc.(map[string]any); ok {
			for key, val := range obj {
				checkKeys(val, t.Elem(), join(path, key), errs)
			}
		}
	}
}

// jsonFields maps a struct's JSON names to their types, with the fields of
// embedded structs promoted as encoding/json does.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			et := f.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				for k, v := range jsonFields(et) {
					out[k] = v
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
