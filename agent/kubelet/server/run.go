package server

import (
	"fmt"
	"net/http"
	"strings"

	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// run runs the command of the cmd parameter (its words split at white
// space) in a container through the CRI's ExecSync and
// answers its output, stdout then stderr; a command that exits non-zero
// is a 500 whose body says its code, then its output.
func (s *server) run(w http.ResponseWriter, r *http.Request) {
	cmd := strings.Fields(r.URL.Query().Get("cmd"))
	if len(cmd) == 0 {
		http.Error(w, "no command to run: set cmd", http.StatusBadRequest)
		return
	}
	var resp *criv1.ExecSyncResponse
	if !s.onContainer(w, r, "run in the container", func(id string) (err error) {
		resp, err = s.cfg.Runtime.ExecSync(r.Context(), &criv1.ExecSyncRequest{ContainerId: id, Cmd: cmd})
		return err
	}) {
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if resp.ExitCode != 0 {
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, "command %q exited with code %d\n", cmd, resp.ExitCode)
	}
	w.Write(resp.Stdout)
	w.Write(resp.Stderr)
}
