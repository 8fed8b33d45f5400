package validate

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/mqlet/mqlet/cri"
)

// checkTerminationMessages refuses a terminationMessagePath the runtime
// would not mount: not absolute, not clean, longer than
// cri.MaxTerminationMessagePathBytes, or beneath /proc or /sys.
func checkTerminationMessages(spec *v1.PodSpec) field.ErrorList {
	var errs field.ErrorList
	visitContainers(spec, func(p *field.Path, c *v1.Container) {
		if c.TerminationMessagePath == "" {
			return
		}
		if err := cri.CheckTerminationMessagePath(c.TerminationMessagePath); err != nil {
			value := c.TerminationMessagePath
			if len(value) > 64 {
				value = value[:64] + "..."
			}
			errs = append(errs, field.Invalid(p.Child("terminationMessagePath"), value, err.Error()))
		}
	})
	return errs
}
