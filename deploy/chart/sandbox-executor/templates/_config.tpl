{{/* The executor's config.toml; (dict "ctx" $ "runner" true) adds the runner image's binaries. */}}
{{- define "sandbox-executor.config" -}}
{{- $ctx := .ctx -}}
{{- include "sandbox-executor.validate" $ctx -}}
{{- $proxied := list }}
{{- range $ctx.Values.templates }}{{ if eq (.egress | default "direct") "proxied" }}{{ $proxied = append $proxied .name }}{{ end }}{{ end }}
# In the cluster: the pod's ServiceAccount token.
kubeconfig = ""
namespace = {{ $ctx.Release.Namespace | quote }}
# Fixed, not the pod's host name: claims are named and labelled by it, and gc reaps the
# claims of this runner_name, whichever runner pod made them.
runner_name = {{ $ctx.Values.executor.runnerName | quote }}
default_pool = {{ $ctx.Values.executor.defaultPool | quote }}
unknown_image = {{ $ctx.Values.executor.unknownImage | quote }}
{{- if eq $ctx.Values.executor.unknownImage "cold" }}
{{- if not $ctx.Values.coldStart.enabled }}
{{- fail "executor.unknownImage cold needs coldStart.enabled (its Role and admission policy)" }}
{{- end }}
cold_template = {{ $ctx.Values.coldStart.template | quote }}
cold_images = {{ toJson $ctx.Values.coldStart.images }}
{{- end }}
runtime_classes = [{{ include "sandbox-executor.runtimeClassName" $ctx | quote }}]
require_fence = {{ $ctx.Values.executor.requireFence }}
{{- $proxiedPools := list }}
{{- range $ctx.Values.pools }}{{ if has .template $proxied }}{{ $proxiedPools = append $proxiedPools .name }}{{ end }}{{ end }}
{{- if .runner }}
{{- if and $ctx.Values.egressProxy.enabled $proxiedPools }}
# The egress proxy's admin API (grants and blocked attempts of proxied pools) takes this bearer token (Secret {{ include "sandbox-executor.egressAdminSecret" $ctx }}).
egress_admin_token_file = {{ printf "%s/token" (include "sandbox-executor.egressAdminDir" $ctx) | quote }}
# over TLS: the proxy's certificate is verified with this CA (Secret {{ include "sandbox-executor.egressAdminTLSSecret" $ctx }}, key ca.crt).
egress_admin_ca_file = {{ printf "%s/ca.crt" (include "sandbox-executor.egressAdminDir" $ctx) | quote }}
{{- end }}
# The runner image's binaries: the agent for templates that do not bake it in, the helper
# for jobs with cache: or artifacts:.
agent_binary = "/usr/local/bin/sandbox-executor-agent"
helper_binary = {{ $ctx.Values.runner.helperBinary | quote }}
{{- if $ctx.Values.runner.stageServer }}
# start-runner serves prepare and cleanup here, with a warm connection to the API server.
stage_server = {{ include "sandbox-executor.stageServerSocket" $ctx | quote }}
{{- end }}
{{- end }}
ready_timeout = {{ $ctx.Values.executor.readyTimeout | quote }}
claim_grace = {{ $ctx.Values.executor.claimGrace | quote }}
{{- if and .runner $ctx.Values.agentTLS.enabled }}
# The agent CA (Secret agentTLS.name): the network transport's client certificates are signed
# with its key, which only the runner pods mount.
agent_ca_cert = "/etc/sandbox-executor-agent-ca/tls.crt"
agent_ca_key = "/etc/sandbox-executor-agent-ca/tls.key"
stage_transport = {{ $ctx.Values.executor.stageTransport | default "network" | quote }}
{{- else }}
stage_transport = "exec"
{{- end }}
{{- with $ctx.Values.executor.extraConfig }}
{{ . }}
{{- end }}
{{- range $ctx.Values.pools }}

[[pool]]
name = {{ .name | quote }}
images = {{ toJson .images }}
{{- if .serveOtherTags }}
# Jobs naming another tag of these images run in this pool's image; their job log warns.
serve_other_tags = true
{{- end }}
{{- if and $ctx.Values.egressProxy.enabled (has .template $proxied) }}
# Where the run stage reads the blocked attempts of this pool's jobs.
egress_proxy = {{ printf "https://%s:3129" (include "sandbox-executor.egressProxyHost" $ctx) | quote }}
{{- if .egressInstance }}
# Each job's own GitLab instance (CI_SERVER_URL of its job JSON) is granted on the proxy.
egress_instance = true
{{- end }}
{{- if .egressInstanceWildcard }}
egress_instance_wildcard = true
{{- end }}
{{- with .egressAllow }}
egress_allow = {{ toJson . }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}


{{/* gc's --drain-timeout: drain.runningJobTimeout where gc runs and drains wait for jobs, and
where the release's admission policy holds gc's patches to annotations (clusterScoped.create);
"" otherwise. */}}
{{- define "sandbox-executor.drainTimeout" -}}
{{- if and .Values.gc.enabled .Values.drain.waitForRunningJobs .Values.clusterScoped.create -}}
{{- .Values.drain.runningJobTimeout -}}
{{- end -}}
{{- end -}}


{{/* Values that would render but fail every job, refused at install in one line each. */}}
{{- define "sandbox-executor.validate" -}}
{{- $duration := "^([0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$" -}}
{{- range $key := list "readyTimeout" "claimGrace" -}}
{{- $v := toString (index $.Values.executor $key) -}}
{{- if not (regexMatch $duration $v) -}}
{{- fail (printf "executor.%s %q is not a Go duration: write it like 90s, 2m or 1h30m" $key $v) -}}
{{- end -}}
{{- end -}}
{{- with $.Values.drain.runningJobTimeout -}}
{{- if not (regexMatch $duration (toString .)) -}}
{{- fail (printf "drain.runningJobTimeout %q is not a Go duration: write it like 45m or 1h30m, or \"\" for no bound" (toString .)) -}}
{{- end -}}
{{- end -}}
{{- $pools := list -}}
{{- $templates := list -}}
{{- range $.Values.templates }}{{ $templates = append $templates .name }}{{ end -}}
{{- range $.Values.pools -}}
{{- $pools = append $pools .name -}}
{{- if not (has .template $templates) -}}
{{- fail (printf "pools[%s].template %q: no templates[] entry has that name, so the pool serves no image" .name .template) -}}
{{- end -}}
{{- $pool := .name -}}
{{- range .images -}}
{{- if regexMatch "[*?\\[\\]\\\\]" . -}}
{{- fail (printf "pools[%s].images %q is a pattern: list the exact image its template runs, and set serveOtherTags: true to serve the jobs that ask for other tags of it" $pool .) -}}
{{- end -}}
{{- end -}}
{{- if and .serveOtherTags (not .images) -}}
{{- fail (printf "pools[%s].serveOtherTags needs images: the exact image its template runs, whose other tags it serves" .name) -}}
{{- end -}}
{{- end -}}
{{- if not (has $.Values.executor.defaultPool $pools) -}}
{{- fail (printf "executor.defaultPool %q names no pool: use one of %s" $.Values.executor.defaultPool (join ", " $pools)) -}}
{{- end -}}
{{- if and $.Values.coldStart.enabled (not (has $.Values.coldStart.template $templates)) -}}
{{- fail (printf "coldStart.template %q: no templates[] entry has that name" $.Values.coldStart.template) -}}
{{- end -}}
{{- $v4 := "^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])/(3[0-2]|[12]?[0-9])$" -}}
{{- $v6 := "^[0-9a-fA-F:.]*:[0-9a-fA-F:.]*/(12[0-8]|1[01][0-9]|[1-9]?[0-9])$" -}}
{{- range $.Values.gitlab.cidrs -}}
{{- if not (or (regexMatch $v4 .) (and (regexMatch $v6 .) (le (len (regexFindAll "::" . -1)) 1))) -}}
{{- fail (printf "gitlab.cidrs %q is not a CIDR: write an address and a prefix length, like 10.20.0.5/32 or 2001:db8::5/128" .) -}}
{{- end -}}
{{- end -}}
{{- if not $.Values.clusterScoped.create -}}
{{- if $.Values.coldStart.enabled -}}
{{- fail "coldStart.enabled needs clusterScoped.create: cold starts are safe only under their ValidatingAdmissionPolicy" -}}
{{- end -}}
{{- if $.Values.metricsAdapter.enabled -}}
{{- fail "metricsAdapter.enabled needs clusterScoped.create: it registers a cluster-scoped APIService" -}}
{{- end -}}
{{- end -}}
{{- end -}}
