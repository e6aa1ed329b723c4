# frozen_string_literal: true
#
# sentence_spout.rb PATH - word-count source. Emits each non-empty line of the
# text file PATH (relative to the working directory, stripped of surrounding
# ASCII whitespace) as [sentence], with message id = the line's 0-based index
# in the file (empty lines count). Failed lines are queued and emitted again
# on a later next_tuple; acked lines are forgotten. Once everything has been
# emitted and nothing is queued, next_tuple emits nothing.

require_relative 'multilang'

class SentenceSpout < Multilang::Spout
  LEADING_SPACE = /\A[ \t\n\v\f\r]+/
  TRAILING_SPACE = /[ \t\n\v\f\r]+\z/

  def initialize(path)
    super()
    @path = path
  end

  def open(_conf, _context)
    text = File.binread(@path).force_encoding(Encoding::UTF_8).scrub
    @lines = text.split("\n", -1).map { |line| strip_ascii(line) }
    @next_index = 0
    @replay = []      # failed ids, emitted again before new lines
    @pending = {}     # id => true while in flight
  end

  def next_tuple
    index = @replay.shift
    if index.nil?
      @next_index += 1 while @next_index < @lines.length && @lines[@next_index].empty?
      return if @next_index >= @lines.length

      index = @next_index
      @next_index += 1
    end
    @pending[index] = true
    emit([@lines[index]], msg_id: index)
  end

  def ack(msg_id)
    @pending.delete(msg_id)
  end

  def fail(msg_id)
    return unless @pending.delete(msg_id)

    @replay << msg_id
  end

  private

  def strip_ascii(line)
    line.sub(LEADING_SPACE, '').sub(TRAILING_SPACE, '')
  end
end

if ARGV.empty?
  warn 'usage: ruby sentence_spout.rb PATH'
  exit 2
end
SentenceSpout.new(ARGV[0]).run
