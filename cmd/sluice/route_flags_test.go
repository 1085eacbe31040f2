package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPoolRouteFlagErrors: a bad pool setting or route stops `sluice run`
// with a message naming the flag, the value and where it came from: the
// command line, a SLUICE_* variable, a -config file line or a
// -backends-file line. Golden messages.
func TestPoolRouteFlagErrors(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "sluice.conf")
	os.WriteFile(conf, []byte("# pools\nhttp-route pool=api,host=api.example\nhttp-route pool=zzz,path=/y\n"), 0o600)
	badConf := filepath.Join(dir, "bad.conf")
	os.WriteFile(badConf, []byte("http-pool name=api,policy=fastest\n"), 0o600)
	backends := filepath.Join(dir, "backends")
	os.WriteFile(backends, []byte("http 127.0.0.1:1,pool=api\n\nhttp-route pool=qq,host=x.example\n"), 0o600)
	badBackends := filepath.Join(dir, "backends2")
	os.WriteFile(badBackends, []byte("http 127.0.0.1:1,pool=api\nhttp-route pool=api,path=~(a\n"), 0o600)
	base := []string{"-data-dir", dir, "-http-listen", "127.0.0.1:0", "-admin-listen", "", "-health-interval", "0", "-http-backend", "127.0.0.1:1,pool=api"}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"route to a pool without backends, command line", append(base, "-http-route", "pool=web,host=a.example"), nil,
			`sluice run: -http-route "pool=web,host=a.example" (command line): pool web has no http backends (name it in a -http-backend's pool=)`},
		{"route to a pool without backends, environment", base, map[string]string{"SLUICE_HTTP_ROUTE": "pool=api,host=a.example pool=web,path=/x"},
			`sluice run: -http-route "pool=web,path=/x" (SLUICE_HTTP_ROUTE): pool web has no http backends (name it in a -http-backend's pool=)`},
		{"route to a pool without backends, config file", append(base, "-config", conf), nil,
			`sluice run: -http-route "pool=zzz,path=/y" (-config ` + conf + `:3): pool zzz has no http backends (name it in a -http-backend's pool=)`},
		{"route to a pool without backends, backends file", []string{"-data-dir", dir, "-admin-listen", "", "-backends-file", backends}, nil,
			`sluice run: -backends-file ` + backends + `:3: -http-route "pool=qq,host=x.example": pool qq has no http backends (name it in a -http-backend's pool=)`},
		{"pool settings of a pool without backends", append(base, "-http-pool", "name=static,policy=p2c"), nil,
			`sluice run: -http-pool "name=static,policy=p2c" (command line): pool static has no http backends (name it in a -http-backend's pool=)`},
		{"arm rule naming no pool", append(base, "-arm", "name=x,limit=10/s,pool=london"), nil,
			`sluice run: -arm "name=x,limit=10/s,pool=london" (command line): pool london is a pool of no front end (pools: api)`},
		{"unknown key, command line", append(base, "-http-route", "pool=api,colour=red"), nil,
			`invalid value "pool=api,colour=red" for flag -http-route: route "pool=api,colour=red": unknown key "colour" for a http route (want pool, host, path, method, header, strip)`},
		{"empty pool, environment", base, map[string]string{"SLUICE_SIP_ROUTE": "pool=,user=+4420"},
			`sluice run: SLUICE_SIP_ROUTE (-sip-route): invalid value "pool=,user=+4420": route "pool=,user=+4420": key "pool" has no value`},
		{"bad regex, environment", base, map[string]string{"SLUICE_HTTP_ROUTE": "pool=api,path=~("},
			"sluice run: SLUICE_HTTP_ROUTE (-http-route): invalid value \"pool=api,path=~(\": route \"pool=api,path=~(\": path \"~(\": bad regular expression: error parsing regexp: missing closing ): `(`"},
		{"bad policy, config file", append(base, "-config", badConf), nil,
			`sluice run: -config ` + badConf + `:1: -http-pool: invalid value "name=api,policy=fastest"`},
		{"bad regex, backends file", []string{"-data-dir", dir, "-admin-listen", "", "-backends-file", badBackends}, nil,
			`sluice run: -backends-file ` + badBackends + `:2: http-route "pool=api,path=~(a": route "pool=api,path=~(a": path "~(a": bad regular expression`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var stderr bytes.Buffer
			code := run(ctx, tc.args, io.Discard, &stderr, nil)
			if code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, stderr:\n%s\nwant 2 and:\n%s", code, stderr.String(), tc.want)
			}
		})
	}
}
