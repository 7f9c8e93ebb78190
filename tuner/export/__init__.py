"""The chosen configuration as files a deployment uses: vllm serve, YAML, docker, Kubernetes."""
