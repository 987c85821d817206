module github.com/cairn-os/cairn/rootfs/components

go 1.26.8
