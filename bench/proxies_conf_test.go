package bench

import (
	"fmt"
	"strings"
)

// section returns the directives of c.conf for one section ("http",
// "location", "server", ...), one a line.
func (c proxyCell) section(name string) string {
	var out []string
	for line := range strings.SplitSeq(c.conf, "\n") {
		if rest, ok := strings.CutPrefix(line, name+": "); ok {
			out = append(out, rest)
		}
	}
	return strings.Join(out, "\n")
}

// nginxConf is the whole configuration of a cell's nginx: one process in
// the foreground (daemon off, no master), everything under dir, one log
// line a request: its status, and the upstream it went to ("-" for a
// refusal of nginx's own).
func nginxConf(c proxyCell, dir string, port int, upstreams []string) string {
	var ups strings.Builder
	for _, u := range upstreams {
		fmt.Fprintf(&ups, "    server %s %s;\n", u, c.section("server"))
	}
	return fmt.Sprintf(`daemon off;
master_process off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 4096; }
http {
  log_format st '$status $upstream_addr $upstream_status';
  access_log %[1]s/requests.log st;
  client_body_temp_path %[1]s/tmp-body;
  proxy_temp_path %[1]s/tmp-proxy;
  fastcgi_temp_path %[1]s/tmp-fastcgi;
  uwsgi_temp_path %[1]s/tmp-uwsgi;
  scgi_temp_path %[1]s/tmp-scgi;
  keepalive_requests 100000;
  %[4]s
  upstream back {
%[3]s    keepalive 64;
  }
  server {
    listen 127.0.0.1:%[2]d;
    location / {
      proxy_pass http://back;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      %[5]s
    }
  }
}
`, dir, port, ups.String(), c.section("http"), c.section("location"))
}

// haproxyConf is the whole configuration of a cell's HAProxy (run with
// -db: in the foreground), one log line a request on its stdout: status,
// server ("<NOSRV>" for a refusal of its own), termination state.
func haproxyConf(c proxyCell, port int, upstreams []string) string {
	var srv strings.Builder
	for i, u := range upstreams {
		fmt.Fprintf(&srv, "  server s%d %s %s\n", i, u, c.section("server"))
	}
	indent := func(s string) string {
		if s == "" {
			return ""
		}
		return "  " + strings.ReplaceAll(s, "\n", "\n  ")
	}
	return fmt.Sprintf(`global
  log stdout format raw local0
  maxconn 4096
defaults
  mode http
  log global
  option dontlognull
  log-format "%%ST %%s %%tsc"
  timeout connect 1s
  timeout client 30s
  timeout server 30s
%[3]s
frontend fe
  bind 127.0.0.1:%[1]d
%[4]s
  default_backend be
backend be
%[2]s`, port, srv.String(), indent(c.section("defaults")), indent(c.section("frontend")))
}
