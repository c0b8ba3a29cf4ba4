"""Kubernetes sandboxes: config, manifests, API calls, the exec websocket, pods (`core.runtime.k8s.runtime.KubernetesRuntime`).

The ``kubernetes`` client itself is imported where it is used (it is heavy), so the run config's
`KubernetesConfig` costs nothing to import.
"""
