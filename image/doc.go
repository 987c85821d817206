// Package image builds Cairn's bootable disk images: unified kernel images
// (UKIs), the raw GPT disk with its EFI system partition and STATE
// partition, conversions of the raw disk to other formats, and a manifest of
// what went in and what came out.
//
// It needs no root, loop devices or containers: filesystems are made on plain
// files by the host's mkfs tools and copied into the disk file. Every output
// is reproducible bit for bit from the same inputs and the same versions of
// those tools.
package image
