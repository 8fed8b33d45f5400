// Package defaults fills unset option fields. An option struct's zero value
// means "use the default", so a zero (or, for numbers, negative) field is
// replaced by its documented default.
package defaults

import "cmp"

// Set replaces *field with def when *field is unset: "" for strings, zero or
// negative for numbers and durations.
func Set[T cmp.Ordered](field *T, def T) {
	var zero T
	if *field <= zero {
		*field = def
	}
}
