package admission

import (
	"fmt"
	"strings"
	"testing"
)

// TestMOPSimKeysShowDefaults: the help of `sluice simulate --mop` shows
// the MOP defaults DefaultMOPConfig holds, so that the text cannot drift
// from them.
func TestMOPSimKeysShowDefaults(t *testing.T) {
	d := DefaultMOPConfig()
	for _, c := range []struct{ flag, value string }{
		{"-mop-max-heap", fmt.Sprintf("%g", d.MaxHeap)},
		{"-mop-window", fmt.Sprintf("%gs", d.Window.Seconds())},
		{"-mop-initial-rate", fmt.Sprintf("%g", d.InitialRate)},
	} {
		found := false
		for _, line := range strings.Split(MOPSimKeys, "\n") {
			if strings.Contains(line, "("+c.flag+")") {
				found = true
				if !strings.HasSuffix(line, "default "+c.value) {
					t.Errorf("MOPSimKeys line %q: want default %s (DefaultMOPConfig)", line, c.value)
				}
			}
		}
		if !found {
			t.Errorf("MOPSimKeys has no line of %s", c.flag)
		}
	}
}
