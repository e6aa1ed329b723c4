# frozen_string_literal: true
#
# multilang.rb - Apache Storm multilang component library for Ruby.
# One file, standard library only (json, monitor, io/wait).
#
# It speaks Storm's standard multilang protocol, so components built on it run
# both under multilang-bridge and under Storm's own ShellBolt / ShellSpout. When
# the host offers the `batch` extension (conf "multilang.extensions", spec §9)
# it is accepted: input tuples may then arrive many per frame, and emits that
# want no task ids, acks and fails are collected into `batch` frames. Set
# `self.extensions = []` in a subclass body (or `MyBolt.run(extensions: [])`,
# or `bolt.extensions = []` before `run`) to speak the standard protocol only.
#
#   require_relative 'multilang'
#
#   class Upper < Multilang::BasicBolt
#     def process(tup)
#       emit([tup.values[0].to_s.upcase])      # auto-anchored, auto-acked
#     end
#   end
#   Upper.new.run                               # or: Upper.run
#
#   # one-file scripts: the block is the process hook
#   Multilang::BasicBolt.run { |tup, bolt| bolt.emit([tup.values[0]]) }
#
# Hooks (override in a subclass, or pass as keyword procs to the class-level
# `run`, each called with the component as last argument):
#   Bolt / BasicBolt  prepare(conf, context)  process(tup)  process_tick(tup)
#   Spout             open(conf, context)  next_tuple  ack(msg_id)  fail(msg_id)
#                     activate  deactivate
# Ruby's own `initialize` is left alone: setup that needs conf/context belongs
# in `prepare` (bolts) or `open` (spouts, where emitting is already legal).
# Inside a Spout `open` is the hook, so use File.open for files; inside a Bolt
# or Spout `fail` is the protocol method, so use `raise` for exceptions.
#
# need_task_ids defaults to FALSE: waiting for one round trip per emit is the
# main throughput killer of multilang. Pass `need_task_ids: true` to get the
# list of task ids back (as pystorm does). Tuples and heartbeats that arrive
# while waiting are queued and handled afterwards, in arrival order.
#
# Errors: an exception escaping BasicBolt#process / #process_tick is sent as an
# `error` frame (message, class, backtrace), the input is failed, and the bolt
# keeps running. Any other exception escaping a hook is sent as an `error`
# frame and the process exits with status 1 (the host restarts it).
# stdin EOF (the host went away) exits with status 0.
#
# stdout belongs to the protocol. Loading this file installs a guard: protocol
# frames go to a private duplicate of fd 1, fd 1 itself (STDOUT, child
# processes) is pointed at stderr, and `$stdout` becomes an object whose
# writes turn into `log` frames (`puts "x"` -> {"command":"log","msg":"x"}).
# Output printed before the handshake reply is held back until after it.

require 'json'
require 'monitor'
require 'io/wait'

module Multilang
  VERSION = '0.1.0'

  # Log levels of the `log` command.
  TRACE = 0
  DEBUG = 1
  INFO = 2
  WARN = 3
  ERROR = 4
  LEVEL_NAMES = { trace: TRACE, debug: DEBUG, info: INFO, warn: WARN,
                  warning: WARN, error: ERROR }.freeze

  # The host broke the protocol (unparsable frame, bad handshake).
  class ProtocolError < StandardError; end

  # An input tuple. `id` is the host's string, echoed back byte for byte.
  Tuple = Struct.new(:id, :component, :stream, :task, :values) do
    def tick?
      component == '__system' && stream == '__tick'
    end

    def heartbeat?
      stream == '__heartbeat'
    end
  end

  # Everything that touches the process's stdin/stdout. There is one stdout
  # per process, so this is a module-level singleton.
  module Wire
    FRAME_END = "\nend\n"
    SYNC_FRAME = %({"command":"sync"}\nend\n)
    FLUSH_BYTES = 64 * 1024 # flush early once this much is buffered
    FLUSH_SECS = 0.5        # ... or when the oldest buffered frame is this old
    BATCH_MAX = 1024        # elements per output batch: far below any frame limit

    @lock = Monitor.new
    @out = nil      # private dup of fd 1: the protocol channel
    @in = nil
    @buf = []       # encoded frames waiting for the next flush
    @bytes = 0
    @since = nil    # clock time of the oldest buffered frame
    @ready = false  # true once the {"pid": N} reply is out
    @early = []     # frames produced before the pid reply
    @pending = []   # frames read while waiting for task ids
    @logger = nil
    @dead = false
    @reading = false
    @batching = false # extension batch accepted (spec §9.5)
    @b_emits = []     # the output batch being filled
    @b_acks = []
    @b_fails = []
    @b_size = 0

    class << self
      attr_reader :logger, :batching

      # Idempotent; called when this file is loaded.
      def install
        return if @out

        $stdout.flush if $stdout.respond_to?(:flush)
        @out = STDOUT.dup # a new fd, close-on-exec: children do not inherit it
        @out.binmode
        @out.sync = true # we buffer ourselves and write whole bursts
        STDOUT.reopen(STDERR) # fd 1 (STDOUT, subprocesses) now goes to stderr
        @in = STDIN
        @in.binmode
        @logger = StdoutLogger.new
        $stdout = @logger
        at_exit { final_flush }
      end

      def synchronize(&block)
        @lock.synchronize(&block)
      end

      # Queue one frame (any JSON-able object).
      def send_frame(obj)
        send_raw(JSON.generate(obj) << FRAME_END)
      end

      def send_sync
        send_raw(SYNC_FRAME)
      end

      def send_raw(data)
        @lock.synchronize do
          @logger&.drain # text printed earlier goes out first
          unless @ready
            @early << data
            return
          end
          close_batch if @b_size.positive? # §9.5: a standard frame keeps the order
          @since ||= now
          @buf << data
          @bytes += data.bytesize
          # @reading: another thread is sending while the main one waits for input.
          flush if @reading || @bytes >= FLUSH_BYTES || now - @since >= FLUSH_SECS
        end
        nil
      end

      # Batch mode (§9.5): add one element to the output batch. An emit is
      # [values, anchors_or_msg_id, stream] with trailing nils left out.
      def batch_emit(elem)
        @lock.synchronize do
          @logger&.drain
          @b_emits << elem
          batch_added
        end
        nil
      end

      def batch_ack(id)
        @lock.synchronize do
          @logger&.drain
          @b_acks << id
          batch_added
        end
        nil
      end

      def batch_fail(id)
        @lock.synchronize do
          @logger&.drain
          @b_fails << id
          batch_added
        end
        nil
      end

      # Write the open output batch into the buffer as one frame.
      def close_batch
        @lock.synchronize do
          return if @b_size.zero?

          frame = { 'command' => 'batch' }
          frame['emits'] = @b_emits unless @b_emits.empty?
          frame['acks'] = @b_acks unless @b_acks.empty?
          frame['fails'] = @b_fails unless @b_fails.empty?
          @b_emits = []
          @b_acks = []
          @b_fails = []
          @b_size = 0
          data = JSON.generate(frame) << FRAME_END
          @since ||= now
          @buf << data
          @bytes += data.bytesize
        end
        nil
      end

      def flush
        @lock.synchronize do
          @logger&.drain
          close_batch if @b_size.positive?
          return if @buf.empty?

          data = @buf
          @buf = []
          @bytes = 0
          @since = nil
          return if @dead

          begin
            @out.write(*data)
          rescue Errno::EPIPE, IOError
            # The host closed our stdout: nobody is listening any more.
            @dead = true
            exit(0)
          end
        end
      end

      def final_flush
        flush
      rescue SystemExit, StandardError
        nil
      end

      # The handshake: read {"pidDir","conf","context"}, create the pid file,
      # reply {"pid": N}, with "extensions" for those of `accept` the host
      # offered (spec §9.1, §9.2). Returns [conf, context].
      def handshake(accept = [])
        msg = read_frame
        eof_exit if msg.nil?
        unless msg.is_a?(Hash) && msg.key?('pidDir')
          raise ProtocolError, "expected the handshake frame {\"pidDir\",\"conf\",\"context\"}, got #{snippet(JSON.generate(msg))}"
        end

        pid = Process.pid
        pid_dir = msg['pidDir']
        if pid_dir.is_a?(String) && !pid_dir.empty?
          begin
            File.open(File.join(pid_dir, pid.to_s), 'w') {}
          rescue SystemCallError => e
            warn "multilang: cannot create the pid file in #{pid_dir}: #{e.message}"
          end
        end
        conf = msg['conf'].is_a?(Hash) ? msg['conf'] : {}
        offered = conf['multilang.extensions']
        accepted = offered.is_a?(Array) ? Array(accept).map(&:to_s).uniq.select { |e| offered.include?(e) } : []
        reply = { 'pid' => pid }
        reply['extensions'] = accepted unless accepted.empty?
        @lock.synchronize do
          @batching = accepted.include?('batch')
          @buf.unshift(JSON.generate(reply) << FRAME_END)
          @buf.concat(@early)
          @early = []
          @ready = true
          flush
        end
        context = msg['context'].is_a?(Hash) ? msg['context'] : {}
        [conf, context]
      end

      # Next frame to handle: queued ones first, then stdin. Exits on EOF.
      def next_message
        return @pending.shift unless @pending.empty?

        msg = read_frame
        eof_exit if msg.nil?
        msg
      end

      # Block until a task-id list (a bare JSON array) arrives; queue anything
      # else that arrives meanwhile, in order.
      def read_task_ids
        loop do
          msg = read_frame
          eof_exit if msg.nil?
          return msg if msg.is_a?(Array)

          @pending << msg
        end
      end

      # Read lines until a line that is exactly "end"; parse the lines before
      # it as one JSON text. Returns nil at EOF.
      LINE_BREAK = /\r\n|\r|\n/n.freeze
      READ_SIZE = 65_536

      # The next line without its line break (\n, \r\n or a lone \r, spec
      # §1.2), or nil at EOF. A \r that ends a chunk ends its line; a \n
      # starting the next chunk is then its tail.
      def read_line
        @rbuf ||= String.new(encoding: Encoding::BINARY)
        @rpos ||= 0
        loop do
          # Binary string: character offsets are byte offsets.
          i = @rbuf.index(LINE_BREAK, @rpos)
          if i
            len = @rbuf.getbyte(i) == 13 && @rbuf.getbyte(i + 1) == 10 ? 2 : 1
            line = @rbuf.byteslice(@rpos, i - @rpos)
            @rpos = i + len
            @skip_lf = len == 1 && @rbuf.getbyte(i) == 13 && @rpos == @rbuf.bytesize
            return line
          end
          @rbuf = @rbuf.byteslice(@rpos..) if @rpos.positive?
          @rpos = 0
          flush_before_read
          @reading = true
          chunk = begin
            @in.readpartial(READ_SIZE)
          rescue EOFError
            nil
          end
          @reading = false
          if chunk.nil?
            return nil if @rbuf.empty?

            line = @rbuf
            @rbuf = String.new(encoding: Encoding::BINARY)
            @rpos = 0
            return line
          end
          chunk = chunk.b
          chunk = chunk.byteslice(1..) if @skip_lf && chunk.start_with?("\n")
          @skip_lf = false
          @rbuf << chunk
        end
      end

      def read_frame
        first = nil
        more = nil
        loop do
          line = read_line
          break if line.nil?

          if line == 'end'
            text = more ? more.join("\n") : first
            first = more = nil
            next if text.nil? || text.strip.empty? # blank lines between frames

            return parse(text)
          end
          if first.nil?
            first = line
          elsif more
            more << line
          else
            more = [first, line]
          end
        end
        nil
      end

      def parse(text)
        text.force_encoding(Encoding::UTF_8)
        JSON.parse(text, max_nesting: false)
      rescue JSON::ParserError => e
        raise ProtocolError, "unparsable frame from the host (#{e.message.lines.first&.strip}): #{snippet(text)}"
      end

      # Coalesce writes: flush only when the next read may block (nothing
      # readable yet), or when buffered frames are getting old.
      def flush_before_read
        return if @buf.empty? && @b_size.zero? && !@logger&.pending?

        readable = begin
          @in.nread
        rescue StandardError
          0
        end
        flush if readable.zero? || @since.nil? || now - @since >= FLUSH_SECS
      end

      def eof_exit
        final_flush
        exit(0)
      end

      private

      def now
        Process.clock_gettime(Process::CLOCK_MONOTONIC)
      end

      # After adding a batch element (lock held): close the batch at
      # BATCH_MAX elements; flush as send_raw would (another thread sending
      # while we wait for input, or output getting old).
      def batch_added
        @b_size += 1
        @since ||= now
        close_batch if @b_size >= BATCH_MAX
        flush if @reading || @bytes >= FLUSH_BYTES || now - @since >= FLUSH_SECS
      end

      def snippet(text)
        s = text.to_s
        s.bytesize > 200 ? "#{s.byteslice(0, 200).scrub.inspect}..." : s.scrub.inspect
      end
    end
  end

  # Replaces $stdout: whatever user code prints becomes `log` frames, one per
  # completed write ending in a newline (that newline removed). Unterminated
  # text is sent before the next protocol frame or read.
  class StdoutLogger
    def initialize
      @pending = String.new(encoding: Encoding::BINARY)
    end

    def write(*args)
      n = 0
      Wire.synchronize do
        args.each do |a|
          s = a.to_s
          n += s.bytesize
          @pending << s.b
        end
        drain if @pending.end_with?("\n")
      end
      n
    end
    alias syswrite write
    alias write_nonblock write

    def <<(obj)
      write(obj)
      self
    end

    def print(*args)
      args = [$_] if args.empty?
      write(*args.map { |a| a.nil? ? '' : a })
      write($\) if $\
      nil
    end

    def puts(*args)
      if args.empty?
        write("\n")
        return nil
      end

      args.each do |a|
        if a.is_a?(Array)
          a.flatten.each { |e| puts(e) }
          next
        end
        s = a.nil? ? '' : a.to_s
        s.end_with?("\n") ? write(s) : write(s, "\n")
      end
      nil
    end

    def printf(fmt, *args)
      write(format(fmt, *args))
      nil
    end

    def putc(ch)
      write(ch.is_a?(Integer) ? (ch & 0xff).chr : ch.to_s[0])
      ch
    end

    def pending?
      !@pending.empty?
    end

    # Send unterminated text now. Called by the wire before any frame.
    def drain
      return if @pending.empty?

      msg = @pending.dup.force_encoding(Encoding::UTF_8).scrub
      @pending.clear
      Wire.send_frame({ 'command' => 'log', 'msg' => msg.chomp })
    end

    def flush
      Wire.flush
      self
    end

    def fsync
      flush
      0
    end

    def sync
      true
    end

    def sync=(value); end

    def tty?
      false
    end
    alias isatty tty?

    def fileno
      nil
    end

    def close; end

    def closed?
      false
    end

    def external_encoding
      Encoding::UTF_8
    end

    def internal_encoding
      nil
    end

    def set_encoding(*)
      self
    end

    def binmode
      self
    end
  end

  # Helpers shared by bolts and spouts.
  class Component
    attr_reader :conf, :context

    # Extensions accepted when the host offers them (spec §9). A subclass
    # overrides it with `self.extensions = []` (standard protocol only).
    DEFAULT_EXTENSIONS = ['batch'].freeze

    class << self
      attr_writer :extensions

      def extensions
        return @extensions unless @extensions.nil?

        superclass.respond_to?(:extensions) ? superclass.extensions : DEFAULT_EXTENSIONS
      end
    end

    # Per instance; defaults to the class setting.
    attr_writer :extensions

    def extensions
      @extensions.nil? ? self.class.extensions : @extensions
    end

    # Class-level runner: `MyBolt.run`, or a block for one-file scripts.
    # `extensions:` overrides the accepted extensions ([] = standard only).
    def self.run(extensions: nil, **hooks, &block)
      comp = new
      comp.extensions = extensions unless extensions.nil?
      comp.send(:install_hooks, block, hooks) if block || !hooks.empty?
      comp.run
    end

    def run
      Wire.install
      begin
        @conf, @context = Wire.handshake(extensions)
        setup
        main_loop
      rescue SystemExit, SignalException
        raise
      rescue ProtocolError => e
        crash(e, 'protocol error')
      rescue Exception => e # rubocop:disable Lint/RescueException
        crash(e, "uncaught exception in #{self.class}")
      ensure
        Wire.final_flush
      end
    end

    def task_id
      @context && @context['taskid']
    end

    def component_id
      @context && @context['componentid']
    end

    # level: 0..4 (TRACE DEBUG INFO WARN ERROR) or :trace/:debug/:info/:warn/:error.
    def log(msg, level: INFO)
      level = LEVEL_NAMES.fetch(level.to_s.downcase.to_sym, INFO) if level.is_a?(Symbol) || level.is_a?(String)
      Wire.send_frame({ 'command' => 'log', 'msg' => Multilang.text(msg), 'level' => level.nil? ? INFO : level })
    end

    def report_error(msg)
      Wire.send_frame({ 'command' => 'error', 'msg' => Multilang.text(msg) })
    end

    def metrics(name, params)
      Wire.send_frame({ 'command' => 'metrics', 'name' => name.to_s, 'params' => params })
    end

    # Write buffered frames now (normally done before every blocking read).
    def flush
      Wire.flush
    end

    private

    def crash(err, what)
      text = "#{what}: #{Multilang.describe_exception(err)}"
      begin
        report_error(text)
        Wire.flush
      rescue StandardError, SystemExit
        nil
      end
      warn "multilang: #{text}"
      exit(1)
    end

    def check_values(values)
      return values if values.is_a?(Array)

      raise TypeError, "tuple values must be an Array, got #{values.class}"
    end

    def stream_name(stream)
      return nil if stream.nil?

      s = stream.to_s
      s == 'default' ? nil : s
    end

    # Emit frame; returns the task ids if asked for (non-direct emits only).
    def send_emit(frame, need_task_ids, direct)
      frame['need_task_ids'] = need_task_ids && !direct ? true : false
      Wire.send_frame(frame)
      return nil if direct || !need_task_ids

      Wire.flush
      Wire.read_task_ids
    end

    def define_hook(name, callable)
      define_singleton_method(name) { |*args| callable.call(*args, self) }
    end

    # `fail` shadows Kernel#fail inside components; keep `fail SomeError, "x"`
    # and `fail some_exception` raising.
    def exception_like?(arg, rest)
      !rest.empty? || arg.is_a?(Exception) || (arg.is_a?(Class) && arg <= Exception)
    end
  end

  # A bolt with explicit acks: user code calls ack/fail for every input.
  class Bolt < Component
    # Hooks ------------------------------------------------------------------
    def prepare(conf, context); end

    def process(tup)
      raise NotImplementedError, "#{self.class} must define process(tup)"
    end

    # Tick tuples (component "__system", stream "__tick") come here only.
    def process_tick(tup)
      ack(tup)
    end

    # Protocol ----------------------------------------------------------------
    # anchors: a Tuple, an id string, or an Array of them (nil/[] = unanchored).
    def emit(values, stream: nil, anchors: nil, need_task_ids: false)
      if Wire.batching && !need_task_ids
        # §9.5: [values, anchors, stream], trailing nils and [] left out.
        ids = anchor_ids(anchors)
        s = stream_name(stream)
        values = check_values(values)
        elem = if s then [values, ids.empty? ? nil : ids, s]
               elsif ids.empty? then [values]
               else [values, ids]
               end
        return Wire.batch_emit(elem)
      end
      frame = { 'command' => 'emit', 'anchors' => anchor_ids(anchors) }
      s = stream_name(stream)
      frame['stream'] = s if s
      frame['tuple'] = check_values(values)
      send_emit(frame, need_task_ids, false)
    end

    def emit_direct(task, values, stream: nil, anchors: nil)
      frame = { 'command' => 'emit', 'anchors' => anchor_ids(anchors) }
      s = stream_name(stream)
      frame['stream'] = s if s
      frame['task'] = Integer(task)
      frame['tuple'] = check_values(values)
      send_emit(frame, false, true)
    end

    def ack(tup)
      return Wire.batch_ack(id_of(tup)) if Wire.batching

      Wire.send_frame({ 'command' => 'ack', 'id' => id_of(tup) })
    end

    def fail(tup, *rest)
      return raise(tup, *rest) if exception_like?(tup, rest)
      return Wire.batch_fail(id_of(tup)) if Wire.batching

      Wire.send_frame({ 'command' => 'fail', 'id' => id_of(tup) })
    end

    private

    def setup
      prepare(@conf, @context)
    end

    def main_loop
      loop do
        msg = Wire.next_message
        unless msg.is_a?(Hash)
          warn "multilang: ignoring an unexpected frame (no emit is waiting for task ids): #{JSON.generate(msg)[0, 200]}"
          next
        end
        if msg['stream'] == '__heartbeat'
          Wire.send_sync # never acked, never shown to user code
        elsif (batch = msg['tuples'])
          raise ProtocolError, 'a tuple batch without the batch extension (spec §9.5)' unless Wire.batching

          # §9.5: [id, comp, stream, task, values] each, in delivery order.
          batch.each do |t|
            if t[2] == '__heartbeat'
              Wire.send_sync
            else
              handle_tuple(Tuple.new(t[0], t[1], t[2], t[3], t[4] || []))
            end
          end
        else
          handle_tuple(Tuple.new(msg['id'], msg['comp'], msg['stream'], msg['task'], msg['tuple'] || []))
        end
      end
    end

    def handle_tuple(tup)
      tup.tick? ? process_tick(tup) : process(tup)
    end

    def default_anchors
      []
    end

    def anchor_ids(anchors)
      return default_anchors if anchors.nil?

      list = anchors.is_a?(Array) ? anchors : [anchors]
      list.map { |a| id_of(a) }
    end

    def id_of(tup)
      tup.is_a?(Tuple) ? tup.id : tup
    end

    def install_hooks(block, hooks)
      define_hook(:process, block) if block
      hooks.each do |name, callable|
        case name.to_sym
        when :prepare then define_hook(:prepare, callable)
        when :process then define_hook(:process, callable)
        when :tick, :process_tick then define_hook(:process_tick, callable)
        else raise ArgumentError, "unknown bolt hook #{name.inspect} (prepare, process, tick)"
        end
      end
    end
  end

  # Auto-anchoring, auto-acking bolt. Emits without `anchors:` are anchored to
  # the current input; the input is acked after process returns (unless user
  # code acked or failed it); an exception sends an `error` frame, fails the
  # input and the bolt keeps running.
  class BasicBolt < Bolt
    def ack(tup)
      @finished = true if @current && id_of(tup) == @current.id
      super
    end

    def fail(tup, *rest)
      return raise(tup, *rest) if exception_like?(tup, rest)

      @finished = true if @current && id_of(tup) == @current.id
      super
    end

    private

    def handle_tuple(tup)
      @current = tup
      @finished = false
      begin
        super
      rescue ProtocolError
        raise
      rescue StandardError, ScriptError, SystemStackError => e
        report_error(Multilang.describe_exception(e))
        fail(tup) unless @finished
        return
      ensure
        @current = nil
      end
      ack(tup) unless @finished
    end

    def default_anchors
      @current ? [@current.id] : []
    end
  end

  # A spout. Every command from the host gets exactly one sync, after the
  # hook returns.
  class Spout < Component
    # Hooks ------------------------------------------------------------------
    def open(conf, context); end # emitting here is legal

    def next_tuple; end

    def ack(msg_id); end

    def fail(msg_id, *rest)
      raise(msg_id, *rest) if exception_like?(msg_id, rest)
    end

    def activate; end

    def deactivate; end

    # Protocol ----------------------------------------------------------------
    # msg_id nil = unreliable; any other JSON value (0 included) is reliable and
    # comes back to ack/fail with its JSON type preserved.
    def emit(values, stream: nil, msg_id: nil, need_task_ids: false)
      if Wire.batching && !need_task_ids
        # §9.5: [values, msg_id, stream], trailing nils left out.
        s = stream_name(stream)
        values = check_values(values)
        elem = if s then [values, msg_id, s]
               elsif msg_id.nil? then [values]
               else [values, msg_id]
               end
        return Wire.batch_emit(elem)
      end
      frame = { 'command' => 'emit' }
      frame['id'] = msg_id unless msg_id.nil?
      s = stream_name(stream)
      frame['stream'] = s if s
      frame['tuple'] = check_values(values)
      send_emit(frame, need_task_ids, false)
    end

    def emit_direct(task, values, stream: nil, msg_id: nil)
      frame = { 'command' => 'emit' }
      frame['id'] = msg_id unless msg_id.nil?
      s = stream_name(stream)
      frame['stream'] = s if s
      frame['task'] = Integer(task)
      frame['tuple'] = check_values(values)
      send_emit(frame, false, true)
    end

    private

    def setup
      open(@conf, @context)
    end

    def main_loop
      loop do
        msg = Wire.next_message
        unless msg.is_a?(Hash)
          warn "multilang: ignoring an unexpected frame (no emit is waiting for task ids): #{JSON.generate(msg)[0, 200]}"
          next
        end
        command = msg['command']
        case command
        when 'next' then next_tuple
        when 'ack' then ack(msg['id'])
        when 'fail' then fail(msg['id'])
        when 'activate' then activate
        when 'deactivate' then deactivate
        else log("multilang: unknown spout command #{JSON.generate(command)}, answering sync", level: WARN)
        end
        Wire.send_sync
      end
    end

    def install_hooks(block, hooks)
      define_hook(:next_tuple, block) if block
      hooks.each do |name, callable|
        case name.to_sym
        when :open, :ack, :fail, :activate, :deactivate, :next_tuple
          define_hook(name.to_sym, callable)
        when :next then define_hook(:next_tuple, callable)
        else raise ArgumentError, "unknown spout hook #{name.inspect} (open, next_tuple, ack, fail, activate, deactivate)"
        end
      end
    end
  end

  def self.text(msg)
    s = msg.is_a?(String) ? msg : msg.to_s
    s.valid_encoding? && s.encoding == Encoding::UTF_8 ? s : s.dup.force_encoding(Encoding::UTF_8).scrub
  end

  def self.describe_exception(err)
    text = +"#{err.message} (#{err.class})"
    (err.backtrace || []).each { |line| text << "\n\tfrom " << line }
    text
  end

  Wire.install
end
