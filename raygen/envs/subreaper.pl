# The child subreaper of raygen/envs/subreaper.py, in Perl: same behaviour, a fifth of the start-up
# cost (about 2 ms of CPU instead of 18), used where perl exists and the prctl syscall number is known.
# Usage: perl subreaper.pl PRCTL_SYSCALL_NUMBER ARGV...
use strict;
use warnings;

my $prctl = shift @ARGV;
pipe(my $status_r, my $status_w) or die "raygen subreaper: pipe: $!\n";
my $keeper = fork();
die "raygen subreaper: fork: $!\n" unless defined $keeper;
if ($keeper == 0) {
    close $status_r;
    # PR_SET_CHILD_SUBREAPER = 36: whatever the command detaches is re-parented here, not to init.
    syscall($prctl, 36, 1, 0, 0, 0) == 0 or print STDERR "raygen subreaper: prctl failed: $!\n";
    my $command = fork();
    die "raygen subreaper: fork: $!\n" unless defined $command;
    if ($command == 0) {
        close $status_w;
        exec { $ARGV[0] } @ARGV or exit 127;
    }
    # Hold none of the command's pipes: the worker stops reading once only background jobs hold them.
    open(STDIN, '<', '/dev/null');
    open(STDOUT, '>', '/dev/null');
    open(STDERR, '>', '/dev/null');
    while ((my $pid = waitpid(-1, 0)) > 0) {
        if ($pid == $command) {
            syswrite($status_w, "$?");
            close $status_w;
        }
    }
    exit 0;    # nothing left: every descendant has ended
}
close $status_w;
my $status = '';
while (sysread($status_r, my $chunk, 64)) { $status .= $chunk; }
exit 137 if $status eq '';    # the keeper was killed before the command ended
if ($status & 127) {          # end the way the command ended, so the caller sees the signal
    my $signal = $status & 127;
    kill $signal, $$;
    exit 128 + $signal;
}
exit $status >> 8;
