package main

import (
	"errors"
	"slices"
)

// reloadSIP puts a new list of SIP backends in force.
func (p *plan) reloadSIP(o *runOptions, specs []string) error {
	if slices.Equal(specs, o.sip.backends) {
		return nil
	}
	return errors.New("the SIP front end cannot change its backends without a restart yet")
}
