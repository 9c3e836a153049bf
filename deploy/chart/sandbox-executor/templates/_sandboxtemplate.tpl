{{- /* sandboxTemplate (list $ TEMPLATE): one templates[] entry's SandboxTemplate, as a YAML
document. One job = one single-use gVisor pod. Nothing job-specific is ever put here: scripts and
job variables reach the pod over the agent's connection or exec stdin only. sandboxtemplates.yaml
renders every entry; the cold-start admission policy (cold-images.yaml) reads the cold template's
pod from the same rendering, so what it admits is the template's shape by construction. */ -}}
{{- define "sandbox-executor.sandboxTemplate" }}
{{- $ := index . 0 }}
{{- $t := index . 1 }}
{{- $fence := $t.fence | default $.Values.jobDefaults.fence }}
{{- $nonRoot := ternary $t.nonRoot $.Values.jobDefaults.nonRoot (hasKey $t "nonRoot") }}
{{- $bake := ternary $t.bakeAgent true (hasKey $t "bakeAgent") }}
{{- $egress := $t.egress | default "direct" }}
{{- if not (has $egress (list "direct" "proxied" "none")) }}
{{- fail (printf "templates[%s].egress %q: use direct, proxied or none" $t.name $egress) }}
{{- end }}
{{- $proxyURL := $t.proxyURL | default (printf "http://%s:3128" (include "sandbox-executor.egressProxyHost" $)) }}
{{- if and (eq $egress "proxied") (not $.Values.egressProxy.enabled) (not $t.proxyURL) }}
{{- fail (printf "templates[%s].egress proxied needs egressProxy.enabled, or the template's proxyURL and egressRules" $t.name) }}
{{- end }}
{{- /* The fence's allowed address, unless given: what this template's egress must reach. */}}
{{- $allow := $fence.allow }}
{{- if and (not $allow) (eq $egress "proxied") }}
{{- $allow = list (regexReplaceAll "^https?://" $proxyURL "" | trimSuffix "/") }}
{{- else if and (not $allow) (eq $egress "direct") $.Values.gitlab.cidrs }}
{{- $first := first $.Values.gitlab.cidrs }}
{{- if not (regexMatch "/(32|128)$" $first) }}
{{- fail (printf "templates[%s]: set jobDefaults.fence.allow (or the template's fence.allow) to the instance's address: gitlab.cidrs %s is a range" $t.name $first) }}
{{- end }}
{{- $addr := regexReplaceAll "/[0-9]+$" $first "" }}
{{- $allow = list (printf (ternary "[%s]:%v" "%s:%v" (contains ":" $addr)) $addr (first $.Values.gitlab.ports)) }}
{{- end }}
{{- $netfenceArgs := include "sandbox-executor.netfenceArgs" (list $ $t) | fromJsonArray }}
{{- $fromImage := include "sandbox-executor.agentFromImage" $ }}
{{- if and (eq $egress "direct") (not (hasKey $t "egressRules")) (not $.Values.gitlab.cidrs) }}
{{- fail (printf "templates[%s].egress direct needs gitlab.cidrs: the instance's addresses the pods may reach" $t.name) }}
{{- end }}
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata:
  name: {{ required "every templates[] entry needs a name" $t.name }}
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "sandbox-executor.labels" $ | nindent 4 }}
    {{- if eq $egress "proxied" }}
    sandbox-executor.io/egress: proxied
    {{- end }}
    {{- with $t.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  # Claims may not inject env: per-job env would force cold starts and leak secrets into pod specs.
  envVarsInjectionPolicy: Disallowed
  networkPolicyManagement: Managed
  networkPolicy:
    ingress:
      {{- if ternary $t.runnerIngress true (hasKey $t "runnerIngress") }}
      # Only from this release's runner pods, only to the in-pod agent's port: the network stage
      # transport connects from the runner to the pod IP. exec needs no ingress (API server).
      - from:
          - podSelector:
              matchLabels:
                {{- include "sandbox-executor.runnerSelector" $ | nindent 16 }}
        ports:
          - {protocol: TCP, port: 7543}
      {{- else }} []
      {{- end }}
    # Egress is an allow-list. Everything else is denied, including 169.254.169.254 (cloud
    # metadata), other pods, node and kubelet ports.
    egress:
      {{- if hasKey $t "egressRules" }}
      {{- if $t.egressRules }}
      {{- toYaml $t.egressRules | nindent 6 }}
      {{- else }} []
      {{- end }}
      {{- else if eq $egress "none" }} []
      {{- else }}
      - to:
          {{- include "sandbox-executor.dnsPeer" $ | nindent 10 }}
        ports:
          - {protocol: UDP, port: 53}
          - {protocol: TCP, port: 53}
      {{- if eq $egress "direct" }}
      # The GitLab instance.
      - to:
          {{- range $.Values.gitlab.cidrs }}
          - ipBlock: {cidr: {{ . }}}
          {{- end }}
        ports:
          {{- range $.Values.gitlab.ports }}
          - {protocol: TCP, port: {{ . }}}
          {{- end }}
      {{- else }}
      # The egress proxy only; it decides by domain.
      - to:
          - podSelector:
              matchLabels:
                {{- include "sandbox-executor.egressProxySelector" $ | nindent 16 }}
        ports:
          - {protocol: TCP, port: 3128}
      {{- end }}
      {{- end }}
  podTemplate:
    metadata:
      labels:
        app.kubernetes.io/name: sandbox-executor-job
        app.kubernetes.io/instance: {{ $.Release.Name }}
        {{- if eq $egress "proxied" }}
        sandbox-executor.io/egress: proxied
        {{- end }}
    spec:
      runtimeClassName: {{ include "sandbox-executor.runtimeClassName" $ }}
      automountServiceAccountToken: false
      enableServiceLinks: false
      terminationGracePeriodSeconds: 2
      {{- include "sandbox-executor.pullSecrets" $ | nindent 6 }}
      securityContext:
        seccompProfile: {type: RuntimeDefault}
        {{- if $nonRoot }}
        runAsNonRoot: true
        runAsUser: {{ $t.runAsUser | default 1000 }}
        runAsGroup: {{ $t.runAsUser | default 1000 }}
        {{- end }}
        {{- with $t.fsGroup }}
        # The image's user owns what it writes to the scratch volumes.
        fsGroup: {{ . }}
        {{- end }}
      {{- if and $bake (or $netfenceArgs (not $fromImage)) }}
      # The stage agent is baked in: the agent image is mounted as a read-only image volume
      # (images.agentVolume), or the install-agent init container copies it from there into a
      # volume, and it runs as the job container's command, so its stage daemon is up before the
      # pod is claimed. Its first log line is its key's hash, which the executor pins (over the
      # API server) before it talks TLS to it. Any image with /bin/sh works: the agent is static.
      initContainers:
        {{- if $netfenceArgs }}
        # Writes the sandbox's iptables before the job container starts; the job container holds
        # neither NET_ADMIN nor NET_RAW and cannot change them. Root with those two capabilities
        # inside gVisor's kernel only, which is why the namespace needs Pod Security privileged.
        - name: netfence
          image: {{ include "sandbox-executor.image" (list $ "sandbox-executor-agent" $.Values.images.agent) }}
          imagePullPolicy: {{ $.Values.images.pullPolicy }}
          command: ["/sandbox-executor-agent"]
          args: {{ toJson $netfenceArgs }}
          # It proves the runtime first (netfence.MinRunsc: docs/security.md) and
          # fails in one line, which becomes its termination message: doctor reports it.
          terminationMessagePolicy: FallbackToLogsOnError
          securityContext:
            runAsUser: 0
            runAsGroup: 0
            runAsNonRoot: false
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {drop: ["ALL"], add: ["NET_ADMIN", "NET_RAW"]}
          resources:
            requests: {cpu: 10m, memory: 16Mi, ephemeral-storage: 16Mi}
            limits: {cpu: 100m, memory: 32Mi, ephemeral-storage: 16Mi}
        {{- end }}
        {{- if not $fromImage }}
        # With it, the runner's helper (gitlab-runner-helper, about 46 MB) when the agent image
        # carries it: prepare links it for jobs with cache or artifacts if its sha256 is the
        # runner's own helper's, instead of copying it over exec.
        - name: install-agent
          image: {{ include "sandbox-executor.image" (list $ "sandbox-executor-agent" $.Values.images.agent) }}
          imagePullPolicy: {{ $.Values.images.pullPolicy }}
          command: ["/sandbox-executor-agent", "install", "/opt/sandbox-executor/agent", "/gitlab-runner-helper", "/opt/sandbox-executor/gitlab-runner-helper"]
          volumeMounts:
            - {name: sandbox-executor-agent, mountPath: /opt/sandbox-executor}
          securityContext:
            {{- include "sandbox-executor.restrictedContainer" $ | nindent 12 }}
          resources:
            requests: {cpu: 10m, memory: 16Mi, ephemeral-storage: 16Mi}
            limits: {cpu: 100m, memory: 96Mi, ephemeral-storage: 16Mi}
        {{- end }}
      {{- end }}
      {{- if or $bake $t.scratchVolumes }}
      volumes:
        {{- if and $bake $fromImage }}
        # The agent image's files (/agent, and the runner's helper with its sha256 when the
        # image carries it), read-only: what install-agent would copy, with nothing to copy.
        - name: sandbox-executor-agent
          image:
            reference: {{ include "sandbox-executor.image" (list $ "sandbox-executor-agent" $.Values.images.agent) }}
            pullPolicy: {{ $.Values.images.pullPolicy }}
        {{- else if $bake }}
        - name: sandbox-executor-agent
          emptyDir: {sizeLimit: 80Mi}
        {{- end }}
        {{- range $t.scratchVolumes }}
        - name: {{ .name }}
          emptyDir: {sizeLimit: {{ .sizeLimit | default "4Gi" }}}
        {{- end }}
      {{- end }}
      containers:
        - name: job
          image: {{ required (printf "templates[%s].image is required" $t.name) $t.image }}
          imagePullPolicy: {{ $t.imagePullPolicy | default $.Values.images.pullPolicy }}
          {{- if $bake }}
          command: ["/opt/sandbox-executor/agent", "serve"]
          {{- else }}
          command: {{ toJson ($t.command | default (list "sleep" "infinity")) }}
          {{- end }}
          workingDir: /
          {{- if or $bake $t.scratchVolumes }}
          volumeMounts:
            {{- if $bake }}
            - {name: sandbox-executor-agent, mountPath: /opt/sandbox-executor, readOnly: true}
            {{- end }}
            {{- range $t.scratchVolumes }}
            # An image without a writable {{ .mountPath }} for its user.
            - {name: {{ .name }}, mountPath: {{ .mountPath }}}
            {{- end }}
          {{- end }}
          env:
            {{- if include "sandbox-executor.agentNetworkPath" (list $ $t) }}
            # The executors the agent serves over the pod network: the agent CA's certificate
            # (public; its key stays with the runners). Without it, stages go over exec, the
            # agent does not listen on 7543 and the netstack fence allows no reply from it.
            - name: SANDBOX_EXECUTOR_AGENT_CLIENT_CA
              valueFrom:
                configMapKeyRef: {name: {{ $.Values.agentTLS.name | quote }}, key: ca.crt}
            {{- end }}
            {{- if eq $egress "proxied" }}
            # Not secret. Lower case too: curl reads only http_proxy for http:// URLs.
            {{- range $k := list "HTTP_PROXY" "HTTPS_PROXY" "http_proxy" "https_proxy" }}
            - {name: {{ $k }}, value: {{ $proxyURL | quote }}}
            {{- end }}
            - {name: NO_PROXY, value: "localhost,127.0.0.1,::1"}
            - {name: no_proxy, value: "localhost,127.0.0.1,::1"}
            {{- end }}
            # The egress fence check (docs/security.md#the-fence-fails-closed): a denied address
            # must not answer, an allowed one must.
            {{- with $fence.deny }}
            - {name: SANDBOX_EXECUTOR_FENCE_DENY, value: {{ join "," . | quote }}}
            {{- end }}
            {{- with $allow }}
            - {name: SANDBOX_EXECUTOR_FENCE_ALLOW, value: {{ join "," . | quote }}}
            {{- end }}
            {{- if and $netfenceArgs (or $fence.deny $allow) }}
            # The netfence init container's table must be in place: the check proves it too.
            - {name: SANDBOX_EXECUTOR_FENCE_NETSTACK, value: "true"}
            {{- end }}
          {{- if $bake }}
          # The kubelet probes from the node, which NetworkPolicy always lets in. Each probe is a
          # fresh fence check: a warm pod whose fence is down is not Ready and not handed out.
          readinessProbe:
            httpGet: {path: /fence, port: 7544}
            periodSeconds: {{ $fence.probePeriodSeconds | default $.Values.jobDefaults.fence.probePeriodSeconds | default 2 }}
            timeoutSeconds: 1
            failureThreshold: 1
          {{- end }}
          securityContext:
            allowPrivilegeEscalation: false
            capabilities:
              drop: ["ALL"]
              {{- if not $nonRoot }}
              # What a CI job running as root in its own image needs: own files, switch users
              # for package managers, signal its own processes.
              add: ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID", "KILL"]
              {{- end }}
          resources:
            {{- toYaml ($t.resources | default $.Values.jobDefaults.resources) | nindent 12 }}
{{- end }}
