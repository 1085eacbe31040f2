package persist

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestOverridesSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []Override{
		{Key: "backend/http/h1/drain", Value: "true", Configured: "false", By: "127.0.0.1:5000"},
		{Key: "arm/invites", Value: "name=invites,limit=500/s", Configured: "name=invites,limit=100/s", By: "10.0.0.1:1 token ops", At: t0},
		{Key: "backend/http/h1/weight", Value: "2", Configured: "1"},
	} {
		if err := s.SetOverride(o); err != nil {
			t.Fatal(err)
		}
	}
	// Replacing by key, deleting by key.
	if err := s.SetOverride(Override{Key: "backend/http/h1/weight", Value: "7", Configured: "1"}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteOverrides("backend/http/h1/drain", "no/such/key"); err != nil {
		t.Fatal(err)
	}
	s.Close(bg)

	s2 := openTest(t, Config{Dir: dir})
	got := s2.Overrides()
	if len(got) != 2 || got[0].Key != "arm/invites" || got[1].Key != "backend/http/h1/weight" || got[1].Value != "7" {
		t.Fatalf("after reopen: %+v", got)
	}
	if got[0].By != "10.0.0.1:1 token ops" || !got[0].At.Equal(t0) || got[1].At.IsZero() {
		t.Errorf("who and when not kept: %+v", got)
	}
	if err := s2.SetOverride(Override{Key: "bad\nkey"}); err == nil {
		t.Error("a key with a newline was accepted")
	}
}

func TestOverridesFileCorrupt(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, Config{Dir: dir})
	if err := s.SetOverride(Override{Key: "arm/a", Value: "name=a,limit=1/s"}); err != nil {
		t.Fatal(err)
	}
	s.Close(bg)
	os.WriteFile(filepath.Join(dir, overridesFile), []byte(`{"overrides": [{"key": "arm/a"}, {"key": "arm/a"}]}`), 0o600)
	_, err := Open(Config{Dir: dir}, nil)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), overridesFile) || !strings.Contains(err.Error(), "-data-reset") {
		t.Fatalf("duplicate key: %v, want ErrCorrupt naming the file and -data-reset", err)
	}
	// -data-reset knows the file as part of the store.
	s3, err := Open(Config{Dir: dir, Reset: true}, nil)
	if err != nil {
		t.Fatalf("reset: %v", err)
	}
	defer s3.Close(bg)
	if len(s3.Overrides()) != 0 {
		t.Error("reset kept overrides")
	}
}

// TestReconcile is the precedence rule: an override applies while the
// configuration still gives the value it replaced; a configuration changed
// since wins.
func TestReconcile(t *testing.T) {
	ovs := []Override{
		{Key: "backend/http/h1/weight", Value: "7", Configured: "1"},
		{Key: "backend/http/h2/weight", Value: "7", Configured: "1"},
		{Key: "arm/invites", Value: "name=invites,limit=500/s", Configured: "name=invites,limit=100/s"},
		{Key: "arm/new", Value: "name=new,limit=5/s", Configured: ""},
		{Key: "arm/gone", Value: "", Configured: "name=gone,limit=1/s"},
	}
	now := map[string]string{
		"backend/http/h1/weight": "1", // unchanged: override applies
		"backend/http/h2/weight": "3", // the flag changed: it wins
		"arm/invites":            "name=invites,limit=100/s",
		"arm/new":                "name=new,limit=9/s", // the file now defines it: the file wins
		"arm/gone":               "name=gone,limit=1/s",
	}
	apply, dropped := Reconcile(ovs, func(k string) string { return now[k] })
	var a, d []string
	for _, o := range apply {
		a = append(a, o.Key)
	}
	for _, o := range dropped {
		d = append(d, o.Key)
	}
	if strings.Join(a, " ") != "backend/http/h1/weight arm/invites arm/gone" || strings.Join(d, " ") != "backend/http/h2/weight arm/new" {
		t.Errorf("apply %v, dropped %v", a, d)
	}
}
