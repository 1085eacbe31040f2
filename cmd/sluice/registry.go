package main

import (
	"flag"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/sluicelb/sluice/tlsedge"
)

// The flag registry: each flag that sets a field of a library's Config is
// declared once, by the field itself (a pointer into the Config) with its
// name and help. Its default is the value the field holds when declared
// (the library's Default* function filled it), its SLUICE_* twin and its
// -config file key are its name (envName, readConfigFile), and the
// field→flag table that turns a library's FieldError into the flag's name
// (flagError) is derived from the declarations: nothing is written twice.

// section declares the flags of one Config struct: pkg and typ name the
// struct as its package's FieldErrors do ("sip" and "" for sip.Config's
// "TokenTTL"; "lb" and "HealthConfig." for "HealthConfig.Rise").
type section struct {
	fs       *flag.FlagSet
	fields   map[string]string // "pkg.typ.Field" -> flag name, shared by the sections of one flag set
	pkg, typ string
	base     reflect.Value // the struct, addressable
}

// newSection returns the section of the struct *cfg (a pointer to a
// struct) whose flags go on fs and whose fields are recorded in fields.
func newSection(fs *flag.FlagSet, fields map[string]string, pkg, typ string, cfg any) section {
	v := reflect.ValueOf(cfg)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		panic(fmt.Sprintf("flag section %s.%s: %T is not a pointer to a struct", pkg, typ, cfg))
	}
	return section{fs: fs, fields: fields, pkg: pkg, typ: typ, base: v.Elem()}
}

// fieldName is the name of the field of s's struct at address p.
func (s section) fieldName(p any) string {
	addr := reflect.ValueOf(p).Pointer()
	for i := range s.base.NumField() {
		if s.base.Field(i).Addr().Pointer() == addr {
			return s.base.Type().Field(i).Name
		}
	}
	panic(fmt.Sprintf("flag section %s.%s: %T is no field of it", s.pkg, s.typ, p))
}

// key is the FieldError key of the field at p: "pkg.typ.Field".
func (s section) key(p any) string { return s.pkg + "." + s.typ + s.fieldName(p) }

// add declares flag name, setting the field at p, with the field's
// present value as its default. p is a *string, *int, *float64,
// *time.Duration or *bool, or a flag.Value whose pointer is the field's
// address (e.g. (*byteSize)(&cfg.MaxBytes)).
func (s section) add(p any, name, usage string) {
	key := s.key(p)
	switch p := p.(type) {
	case *string:
		s.fs.StringVar(p, name, *p, usage)
	case *int:
		s.fs.IntVar(p, name, *p, usage)
	case *float64:
		s.fs.Float64Var(p, name, *p, usage)
	case *time.Duration:
		s.fs.DurationVar(p, name, *p, usage)
	case *bool:
		s.fs.BoolVar(p, name, *p, usage)
	case flag.Value:
		s.fs.Var(p, name, usage)
	default:
		panic(fmt.Sprintf("flag -%s: %T is no flag type", name, p))
	}
	s.record(key, name)
}

// fn declares flag name, setting the field at p through set (a flag whose
// text is parsed into a type of the library's own).
func (s section) fn(p any, name, usage string, set func(string) error) {
	s.fs.Func(name, usage, set)
	s.record(s.key(p), name)
}

// also records that flag name, declared apart (its value is not the
// field's type: a repeatable flag of specs, say), sets the field at p.
func (s section) also(p any, name string) { s.record(s.key(p), name) }

func (s section) record(key, name string) {
	if old, dup := s.fields[key]; dup {
		panic(fmt.Sprintf("field %s set by two flags: -%s and -%s", key, old, name))
	}
	s.fields[key] = name
}

// fieldFlags maps a library's Config field, as its FieldError names it
// ("sip.TokenTTL", "lb.HealthConfig.Rise"), to the flag of `sluice run`
// that sets it: derived from the flags' declarations.
var fieldFlags = sync.OnceValue(func() map[string]string {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	return newRunFlags(fs).fields
})

// renamedFlags maps a flag's former name to its name: the former is still
// read (command line, SLUICE_* twin, -config file) and sets the same
// value, but is not written back by GET /control/config.
var renamedFlags = map[string]string{
	"sip-drain-default": "sip-busy-default", // "drain" is an operator's drain of a backend
}

// renamed declares old, a key of renamedFlags, as the former name of its
// flag on fs.
func renamed(fs *flag.FlagSet, old string) {
	name := renamedFlags[old]
	f := fs.Lookup(name)
	if f == nil {
		panic("renamed: no flag -" + name + " for -" + old)
	}
	fs.Var(f.Value, old, "former name of -"+name)
}

// markRenamed makes a flag and its former name set together in set, so
// that a later source sets neither.
func markRenamed(set map[string]bool) {
	for old, name := range renamedFlags {
		if set[old] || set[name] {
			set[old], set[name] = true, true
		}
	}
}

// tlsFlags registers the flags of tlsedge.Config on fs (sluice run):
// the certificates every TLS listener shares and the bound on
// handshakes, recording in fields the field each sets; certs receives the
// -tls-cert values (checked as they are read).
func tlsFlags(fs *flag.FlagSet, fields map[string]string, cfg *tlsedge.Config, certs *listFlag) {
	*cfg = tlsedge.DefaultConfig()
	sec := newSection(fs, fields, "tlsedge", "", cfg)
	certs.check = func(s string) error { _, err := tlsedge.ParseCertSpec(s); return err }
	fs.Var(certs, "tls-cert", "`certificate` of the TLS listeners: CERTFILE[,key=KEYFILE], a PEM chain, leaf first, and its private key (ECDSA, RSA or Ed25519, unencrypted; in CERTFILE too when key= is not given, as HAProxy's crt); repeatable: chosen by SNI among their names (exact, then wildcard, then the first given); re-read on SIGHUP and when the files change, a bad new file refused while the old certificate serves on")
	sec.also(&cfg.Certs, "tls-cert")
	sec.add(&cfg.HandshakesMax, "tls-handshakes-max", "most TLS and WebSocket handshakes under way at once on all listeners together; more connections are closed without one (0: no bound)")
	sec.add(&cfg.HandshakeRate, "tls-handshake-rate", "most TLS and WebSocket handshakes started per second on all listeners together, with a burst of one second's worth; more connections are closed without one (0: no cap)")
	sec.add(&cfg.HandshakeTimeout, "tls-handshake-timeout", "close a connection whose TLS or WebSocket handshake takes longer")
}

// tlsSettings is the tlsedge.Config of the -tls-* flags.
func (o *runOptions) tlsSettings() tlsedge.Config {
	c := o.tls
	c.Certs = o.tlsCerts.values
	return c
}
