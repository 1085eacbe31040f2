//go:build !unix

package opfile

import (
	"fmt"
	"io/fs"
	"os"
)

const (
	oNonblock = 0
	oNofollow = 0
)

// checkNoLink refuses a link before the open (no O_NOFOLLOW here).
func checkNoLink(path string) error {
	st, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if st.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("%s %w: refused", path, ErrSymlink)
	}
	return nil
}
