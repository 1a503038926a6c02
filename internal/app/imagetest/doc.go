// Package imagetest tests the reaper's container image (make image): it builds the image,
// exports its file system and runs the reaper from it, chrooted into that file system as the
// image's user, against a throwaway Postgres and the in-process broker. It has no code of its
// own; see image_test.go.
package imagetest
