// placeholder: filled by the kernels work
