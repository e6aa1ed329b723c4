# frozen_string_literal: true
#
# count_bolt.rb - word-count counter (BasicBolt). Input field 0 is a word;
# counts[word] += 1 and [word, count] is emitted, anchored to the input.

require_relative 'multilang'

class CountBolt < Multilang::BasicBolt
  def prepare(_conf, _context)
    @counts = Hash.new(0)
  end

  def process(tup)
    word = tup.values[0]
    emit([word, @counts[word] += 1])
  end
end

CountBolt.run
