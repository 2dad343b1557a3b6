"""The kubelet PodResources v1 API: api.proto and the stubs grpcio-tools made from it."""
