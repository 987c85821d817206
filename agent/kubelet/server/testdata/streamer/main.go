// Command streamer is the test workload of the kubelet server's streams;
// its first argument picks what it does:
//
//	serve     links /usr/bin/tar to itself, prints "serving", answers HTTP
//	          on :8080 (GET / says hello, GET /bytes/N sends N bytes) and
//	          echoes each line of stdin as "stdin: LINE"
//	cat       copies stdin to stdout, then prints "eof"
//	exit N    prints "exiting N" on stderr and exits with code N
//	tty       prints whether stdin is a terminal and its size, the size
//	          again at each SIGWINCH, and exits at a line "q" on stdin
//	logs      prints "early", "late" 3 s later, four ticks, and exits 3
//
// Run as tar, it is the little of tar that kubectl cp runs: "tar cf - PATH"
// and "tar -xmf - [-C DIR]".
package main

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if filepath.Base(os.Args[0]) == "tar" {
		if err := tarMain(os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, "tar:", err)
			os.Exit(2)
		}
		return
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: streamer serve|cat|exit N|tty|logs")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve()
	case "cat":
		_, err = io.Copy(os.Stdout, os.Stdin)
		fmt.Println("eof")
	case "exit":
		code, _ := strconv.Atoi(os.Args[2])
		fmt.Fprintln(os.Stderr, "exiting", code)
		os.Exit(code)
	case "tty":
		err = tty()
	case "logs":
		fmt.Println("early")
		time.Sleep(3 * time.Second)
		fmt.Println("late")
		for i := 1; i <= 4; i++ {
			time.Sleep(250 * time.Millisecond)
			fmt.Println("tick", i)
		}
		os.Exit(3)
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "streamer:", err)
		os.Exit(1)
	}
}

func serve() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if err := os.Symlink(self, "/usr/bin/tar"); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			fmt.Println("stdin:", sc.Text())
		}
	}()
	http.HandleFunc("GET /", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "hello from the pod")
	})
	zeros := make([]byte, 64<<10)
	http.HandleFunc("GET /bytes/{n}", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.PathValue("n"), 10, 64)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		for n > 0 {
			m, err := w.Write(zeros[:min(n, int64(len(zeros)))])
			if err != nil {
				return
			}
			n -= int64(m)
		}
	})
	fmt.Println("serving")
	return http.ListenAndServe(":8080", nil)
}

func tty() error {
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	ws, err := unix.IoctlGetWinsize(0, unix.TIOCGWINSZ)
	if err != nil {
		fmt.Println("tty=false")
		return nil
	}
	fmt.Printf("tty=true size=%dx%d\n", ws.Row, ws.Col)
	go func() {
		for range winch {
			if ws, err := unix.IoctlGetWinsize(0, unix.TIOCGWINSZ); err == nil {
				fmt.Printf("size=%dx%d\n", ws.Row, ws.Col)
			}
		}
	}()
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "q" {
			return nil
		}
	}
	return errors.New("stdin ended before a line q")
}

// tarMain is "tar cf - PATH" or "tar -xmf - [-C DIR]", other flags ignored.
func tarMain(args []string) error {
	dir := "."
	var create bool
	var paths []string
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "cf":
			create = true
		case a == "-C" && i+1 < len(args):
			i++
			dir = args[i]
		case a == "-" || strings.HasPrefix(a, "-"):
		default:
			paths = append(paths, a)
		}
	}
	if create {
		tw := tar.NewWriter(os.Stdout)
		for _, p := range paths {
			if err := addTree(tw, p); err != nil {
				return err
			}
		}
		return tw.Close()
	}
	return extract(tar.NewReader(os.Stdin), dir)
}

// addTree writes the file or tree at root, names without the leading
// slash, as tar writes them.
func addTree(tw *tar.Writer, root string) error {
	return filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name = strings.TrimLeft(p, "/")
		if fi.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
}

func extract(tr *tar.Reader, dir string) error {
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			err = writeFile(p, tr, os.FileMode(h.Mode).Perm())
		}
		if err != nil {
			return err
		}
	}
}

func writeFile(p string, r io.Reader, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
