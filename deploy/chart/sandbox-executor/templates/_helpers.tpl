{{/* The name of the release's namespaced objects: the release name when it already says
sandbox-executor, else "<release>-sandbox-executor". */}}
{{- define "sandbox-executor.fullname" -}}
{{- if contains "sandbox-executor" .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-sandbox-executor" .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Cluster-scoped objects are shared by every release on the cluster: their names carry the
namespace too (once, when it is the same as the release's name). */}}
{{- define "sandbox-executor.clusterName" -}}
{{- $full := include "sandbox-executor.fullname" . -}}
{{- if eq $full .Release.Namespace -}}
{{- $full -}}
{{- else -}}
{{- printf "%s-%s" .Release.Namespace $full | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sandbox-executor.runtimeClassName" -}}
{{- if .Values.runtimeClass.name -}}
{{- .Values.runtimeClass.name -}}
{{- else if and .Values.runtimeClass.create .Values.clusterScoped.create -}}
{{- printf "%s-gvisor" (include "sandbox-executor.clusterName" .) -}}
{{- else -}}
{{- fail "runtimeClass.name is required when runtimeClass.create or clusterScoped.create is false: name the gVisor RuntimeClass your cluster has" -}}
{{- end -}}
{{- end -}}

{{/* The executor's ServiceAccount: the runner's pods, and whoever runs doctor with its token. */}}
{{- define "sandbox-executor.serviceAccount" -}}
{{- include "sandbox-executor.fullname" . -}}
{{- end -}}

{{- define "sandbox-executor.labels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sandbox-executor
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The runner pods' labels: job pods' and the egress proxy's NetworkPolicies admit these. */}}
{{- define "sandbox-executor.runnerSelector" -}}
app.kubernetes.io/name: sandbox-executor-runner
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sandbox-executor.egressProxySelector" -}}
app.kubernetes.io/name: sandbox-egress-proxy
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* agentFromImage: "true" when job pods mount the agent image as an image volume
(images.agentVolume; auto: Kubernetes 1.36+, where ImageVolume is GA), else "" (the
install-agent init container copies it). */}}
{{- define "sandbox-executor.agentFromImage" -}}
{{- $mode := .Values.images.agentVolume | default "auto" -}}
{{- if or (eq $mode "image") (and (eq $mode "auto") (semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version)) -}}
true
{{- end -}}
{{- end -}}

{{/* image NAME OVERRIDE: OVERRIDE, else images.repository/NAME:(images.tag or appVersion). */}}
{{- define "sandbox-executor.image" -}}
{{- $ctx := index . 0 -}}
{{- $name := index . 1 -}}
{{- $override := index . 2 -}}
{{- $ref := $override -}}
{{- if not $ref -}}
{{- $ref = printf "%s/%s:%s" $ctx.Values.images.repository $name ($ctx.Values.images.tag | default $ctx.Chart.AppVersion) -}}
{{- end -}}
{{- if or (hasSuffix ":latest" $ref) (not (regexMatch "[:@][^/]+$" $ref)) -}}
{{- fail (printf "image %s: pin a tag or digest (images are never :latest)" $ref) -}}
{{- end -}}
{{- $ref -}}
{{- end -}}

{{- define "sandbox-executor.egressProxyHost" -}}
{{- printf "%s-egress-proxy.%s.svc" (include "sandbox-executor.fullname" .) .Release.Namespace -}}
{{- end -}}

{{- define "sandbox-executor.pullSecrets" -}}
{{- with .Values.images.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Hardening every container of ours shares. */}}
{{- define "sandbox-executor.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: ["ALL"]}
{{- end -}}

{{- define "sandbox-executor.restrictedPod" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{/* What kube.Observer reads (kube.ObservePermissions), all of it list and watch in the release's
namespace: the exporter's and the metrics adapter's Roles. Nothing secret. */}}
{{- define "sandbox-executor.observeRules" -}}
- apiGroups: ["extensions.agents.x-k8s.io"]
  resources: ["sandboxwarmpools", "sandboxclaims"]
  verbs: ["list", "watch"]
- apiGroups: ["agents.x-k8s.io"]
  resources: ["sandboxes"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
{{- end -}}

{{/* The stage server's socket in the runner pod: in its home, which only the runner's user enters. */}}
{{- define "sandbox-executor.stageServerSocket" -}}
/home/nonroot/.sandbox-executor/stages.sock
{{- end }}

{{/* The binary prepare and cleanup start: the stage launcher when the stage server runs. */}}
{{- define "sandbox-executor.servedStageExec" -}}
{{- if .Values.runner.stageServer }}sandbox-executor-stage{{ else }}sandbox-executor{{ end }}
{{- end }}

{{/* The binary run starts: the stage launcher when the stage server runs and serves run. */}}
{{- define "sandbox-executor.runExec" -}}
{{- if and .Values.runner.stageServer .Values.runner.serveRun }}sandbox-executor-stage{{ else }}sandbox-executor{{ end }}
{{- end }}

{{/* Where a pod of ours runs: a component's nodeSelector, tolerations, affinity and
priorityClassName (each optional), at the pod spec's indentation. */}}
{{- define "sandbox-executor.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* The cluster's DNS servers as a NetworkPolicy peer (dns values). */}}
{{- define "sandbox-executor.dnsPeer" -}}
- namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: {{ .Values.dns.namespace }}
  podSelector:
    matchLabels:
      {{- toYaml (.Values.dns.podLabels | default (dict "k8s-app" "kube-dns")) | nindent 6 }}
{{- end -}}

{{/* The egress proxy's admin token: a Secret with key token, the chart's unless the user names one. */}}
{{- define "sandbox-executor.egressAdminSecret" -}}
{{- .Values.egressProxy.adminToken.existingSecret | default (printf "%s-egress-admin" (include "sandbox-executor.fullname" .)) -}}
{{- end -}}

{{- define "sandbox-executor.egressAdminTLSSecret" -}}
{{- .Values.egressProxy.adminTLS.existingSecret | default (printf "%s-egress-admin-tls" (include "sandbox-executor.fullname" .)) -}}
{{- end -}}

{{/* Where the proxy pods mount the admin API's certificate and key (tls.crt, tls.key). */}}
{{- define "sandbox-executor.egressAdminTLSDir" -}}
/etc/sandbox-egress-proxy-tls
{{- end -}}

{{/* Where runner and proxy pods mount the admin token, and runner pods the admin API's CA (ca.crt) beside it (the contract with egress/ and the executor config). */}}
{{- define "sandbox-executor.egressAdminDir" -}}
/etc/sandbox-executor/egress-admin
{{- end -}}

{{/* The instance's CA (gitlab.certsSecretName) in the runner pod. */}}
{{- define "sandbox-executor.gitlabCAFile" -}}
/etc/gitlab-runner-certs/ca.crt
{{- end -}}

{{/* The agent CA comes from the hook Job: the Secret and ConfigMap exist before anything uses them. */}}
{{- define "sandbox-executor.agentCAJob" -}}
{{- printf "%s-agent-ca" (include "sandbox-executor.fullname" .) -}}
{{- end -}}

{{/* The cluster-scoped objects are rendered (clusterScoped.create). */}}
{{- define "sandbox-executor.clusterScoped" -}}
{{- if .Values.clusterScoped.create }}true{{ end -}}
{{- end -}}

{{- /* agentNetworkPath (list $ TEMPLATE): "true" when the template's agent serves the network
transport on 7543, "" otherwise. The agent listens there only when its pod has the agent CA in
SANDBOX_EXECUTOR_AGENT_CLIENT_CA, which the template sets only for a baked agent with agentTLS; the
netstack fence allows replies from 7543 on the same condition. */ -}}
{{- define "sandbox-executor.agentNetworkPath" -}}
{{- $ := index . 0 }}
{{- $t := index . 1 }}
{{- if and (ternary $t.bakeAgent true (hasKey $t "bakeAgent")) $.Values.agentTLS.enabled }}true{{ end }}
{{- end -}}

{{- /* netfenceArgs (list $ TEMPLATE): the netfence init container's args for a template, as JSON,
[] when it has none. The netstack fence (docs/security.md#the-netstack-fence) writes the same
egress as the template's NetworkPolicy into the gVisor sandbox's own iptables, so it holds while
the node's NetworkPolicy agent restarts; only ipBlock rules with ports can be mirrored there. The
templates and the cold-start admission policy (which admits exactly these args) share it. */ -}}
{{- define "sandbox-executor.netfenceArgs" -}}
{{- $ := index . 0 }}
{{- $t := index . 1 }}
{{- $bake := ternary $t.bakeAgent true (hasKey $t "bakeAgent") }}
{{- $egress := $t.egress | default "direct" }}
{{- $proxyURL := $t.proxyURL | default (printf "http://%s:3128" (include "sandbox-executor.egressProxyHost" $)) }}
{{- $netfence := ternary $t.netstackFence $.Values.jobDefaults.netstackFence.enabled (hasKey $t "netstackFence") }}
{{- if and $netfence (not $bake) }}
{{- if hasKey $t "netstackFence" }}
{{- fail (printf "templates[%s].netstackFence needs bakeAgent: the fence accepts the agent's replies from its ports, which only a baked agent holds" $t.name) }}
{{- end }}
{{- $netfence = false }}
{{- end }}
{{- $netfenceArgs := list "netfence" }}
{{- range $.Values.jobDefaults.netstackFence.replyTo }}
{{- if regexMatch "/0+$" . }}{{ fail (printf "jobDefaults.netstackFence.replyTo %s is every address: name the networks the agent's clients connect from (the runner pods', the kubelet's)" .) }}{{ end }}
{{- $netfenceArgs = concat $netfenceArgs (list "--reply-to" .) }}
{{- end }}
{{- /* Replies only from the ports the baked agent listens on: 7543, the network transport, only
when the pod has the agent CA (agentNetworkPath); 7544, the readiness probe's, always (a template
without the fence check's addresses gets no listener there, and its pods never turn Ready). A
reply rule for a port nothing holds lets any job process bind it and send from it to every
replyTo network. */}}
{{- if include "sandbox-executor.agentNetworkPath" (list $ $t) }}
{{- $netfenceArgs = concat $netfenceArgs (list "--reply-port" "7543") }}
{{- end }}
{{- $netfenceArgs = concat $netfenceArgs (list "--reply-port" "7544") }}
{{- if hasKey $t "egressRules" }}
{{- range $i, $rule := $t.egressRules }}
{{- if or (not $rule.to) (not $rule.ports) }}
{{- if $netfence }}{{ fail (printf "templates[%s].egressRules[%d]: the netstack fence mirrors only rules with both to (ipBlock) and ports; list them, or set templates[%s].netstackFence: false" $t.name $i $t.name) }}{{ end }}
{{- end }}
{{- range $rule.to }}
{{- if or (not .ipBlock) .podSelector .namespaceSelector (and .ipBlock .ipBlock.except) }}
{{- if $netfence }}{{ fail (printf "templates[%s].egressRules[%d]: the netstack fence mirrors only ipBlock peers without except; use ipBlock, or set templates[%s].netstackFence: false" $t.name $i $t.name) }}{{ end }}
{{- else }}
{{- $cidr := .ipBlock.cidr }}
{{- range $rule.ports }}
{{- $netfenceArgs = concat $netfenceArgs (list "--allow" (printf "%s:%v/%s" $cidr .port (lower (.protocol | default "TCP")))) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- else if eq $egress "direct" }}
{{- $netfenceArgs = append $netfenceArgs "--allow-dns" }}
{{- range $cidr := $.Values.gitlab.cidrs }}
{{- range $port := $.Values.gitlab.ports }}
{{- $netfenceArgs = concat $netfenceArgs (list "--allow" (printf "%s:%v" $cidr $port)) }}
{{- end }}
{{- end }}
{{- else if eq $egress "proxied" }}
{{- $proxy := urlParse $proxyURL }}
{{- $proxyHostPort := ternary $proxy.host (printf "%s:%s" $proxy.host (ternary "443" "80" (eq $proxy.scheme "https"))) (contains ":" $proxy.host) }}
{{- $netfenceArgs = concat $netfenceArgs (list "--allow-dns" "--allow-host" $proxyHostPort) }}
{{- end }}
{{- if $netfence }}{{ toJson $netfenceArgs }}{{ else }}[]{{ end }}
{{- end -}}

{{- /* templateRefHash NAME: agent-sandbox's SandboxTemplateRefHash of a template's name, the
FNV-1a hash of its bytes in 8 hex digits (kube.TemplateRefHash; tests/chart checks they agree).
It is the value of the agents.x-k8s.io/sandbox-template-ref-hash label the template's managed
NetworkPolicy selects pods by. Sprig has no FNV and no XOR: the XOR of each byte into the low
byte of the hash is done bit by bit. Names are ASCII (a template's is a DNS subdomain). */ -}}
{{- define "sandbox-executor.templateRefHash" -}}
{{- $codes := dict }}
{{- range $c := until 128 }}{{ $_ := set $codes (printf "%c" $c) $c }}{{ end }}
{{- $h := 2166136261 }}
{{- range $ch := splitList "" . }}
{{- if not (hasKey $codes $ch) }}{{ fail (printf "SandboxTemplate name %q is not ASCII" $) }}{{ end }}
{{- $b := get $codes $ch }}
{{- $low := mod $h 256 }}
{{- $x := 0 }}
{{- range $p := list 1 2 4 8 16 32 64 128 }}
{{- if ne (mod (div $low $p) 2) (mod (div $b $p) 2) }}{{ $x = add $x $p }}{{ end }}
{{- end }}
{{- $h = mod (mul (add (sub $h $low) $x) 16777619) 4294967296 }}
{{- end }}
{{- printf "%08x" $h }}
{{- end -}}

{{- /* celLiteral VALUE: a CEL literal of a value read from YAML (maps, lists, scalars), each map
value and list element wrapped in dyn(): the API server's CEL environment takes only homogeneous
aggregate literals, and a container's env or an init container's fields are not (strings beside
maps and lists). dyn() changes no value, so the literal equals the object it was read from. */ -}}
{{- define "sandbox-executor.celLiteral" -}}
{{- if kindIs "map" . -}}
{{- $parts := list -}}
{{- range $k := keys . | sortAlpha -}}
{{- $parts = append $parts (printf "%s: dyn(%s)" (toJson $k) (include "sandbox-executor.celLiteral" (get $ $k))) -}}
{{- end -}}
{{- printf "{%s}" (join ", " $parts) -}}
{{- else if kindIs "slice" . -}}
{{- $parts := list -}}
{{- range . -}}
{{- $parts = append $parts (printf "dyn(%s)" (include "sandbox-executor.celLiteral" .)) -}}
{{- end -}}
{{- printf "[%s]" (join ", " $parts) -}}
{{- else -}}
{{- toJson . -}}
{{- end -}}
{{- end -}}
